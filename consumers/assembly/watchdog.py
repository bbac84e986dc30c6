"""A worker that never settles into its group is stopped, so that its supervisor restarts it.

Faust can hang while it joins the consumer group or restores its tables (the recovery waits on
a fetch that never comes: a known class of Faust bugs). The worker then looks alive and holds
its partitions while nothing is assembled. `RebalanceWatchdog` measures how long the worker has
been unsettled (not yet through its first rebalance, or inside one) and says when that passes
`rebalance_timeout_s`; the assembler then stops with one error line and exit status 1, and the
pipeline's supervisor starts it again, as it does after a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RebalanceWatchdog"]


@dataclass(slots=True)
class RebalanceWatchdog:
    """How long a worker has been unsettled; pure bookkeeping (the caller polls it)."""

    timeout_s: float
    """Longest wait for the group join and the table recovery (0: never give up)."""
    clock: Callable[[], float] = time.monotonic
    _since: float | None = field(init=False)

    def __post_init__(self) -> None:
        self._since = self.clock()  # a worker starts unsettled

    @property
    def poll_s(self) -> float:
        """How often to poll: a quarter of the timeout, at most 5 s."""
        return min(5.0, self.timeout_s / 4)

    def overdue(self, settled: bool) -> float | None:
        """Seconds unsettled when that is at least the timeout, else None (`settled`: the
        worker's state now)."""
        now = self.clock()
        if settled:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        waited = now - self._since
        return waited if self.timeout_s > 0 and waited >= self.timeout_s else None
