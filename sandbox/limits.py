"""Operator-owned limits: what one session may ask for, and what all live sessions may hold.

The gateway's operator sets the per-session maxima and the total budget; a client asks within
the maxima or gets `LimitExceeded` (HTTP 400), and a session that would overdraw the budget gets
`CapacityExceeded` (HTTP 503, retriable). At construction the budget is checked against the host:
the sum of the sessions' pids limits must leave the host room under its `pid_max`, the sum of
their memory limits must fit its memory (times an explicit overcommit), and no session may ask
for more cores than it has.
"""

from __future__ import annotations

from dataclasses import dataclass

from stacx.sandbox.errors import CapacityExceeded, GatewayConfigError, LimitExceeded
from stacx.sandbox.protocols import HostCapacity

__all__ = ["LINUX_DEFAULT_PID_MAX", "PID_RESERVE", "Reservation", "SessionLimits"]

LINUX_DEFAULT_PID_MAX = 32768
"""Assumed when the host's pid_max cannot be read (a remote engine): the kernel's default."""
PID_RESERVE = 4096
"""Pids the budget always leaves to the host itself (services, the gateway, Kafka's threads)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """The limits one live sandbox holds against the budget."""

    cpus: float
    memory_mb: int
    pids: int


class SessionLimits:
    """The resolved maxima and budget of one gateway, and the reservations of its sandboxes."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        max_cpus: float | None = None
        """Largest CPU quota one session may ask for (None: the host's cores)."""
        max_memory_mb: int | None = None
        """Largest memory limit one session may ask for (None: the whole memory budget)."""
        max_pids: int = 1024
        """Largest pids limit one session may ask for."""
        max_idle_timeout_s: float = 4 * 3600.0
        """Longest idle timeout one session may ask for."""
        budget_pids: int | None = None
        """Sum of the pids limits of all live sandboxes (None: 3/4 of the host's pid_max); at
        most pid_max minus `PID_RESERVE`: a fork bomb in every sandbox still leaves the host pids."""
        budget_memory_mb: int | None = None
        """Sum of the memory limits of all live sandboxes (None: the host's memory times
        `memory_overcommit`); at most that."""
        memory_overcommit: float = 1.0
        """How far the memory limits may add up past the host's memory (limits are ceilings
        sandboxes rarely reach; 2.0 lets them sum to twice the RAM, at the risk of host OOM)."""
        budget_cpus: float | None = None
        """Sum of the CPU quotas of all live sandboxes (None: no sum; quotas are ceilings and
        oversubscribed cores only slow sandboxes down); at most the host's cores."""

        def __post_init__(self) -> None:
            if self.memory_overcommit < 1.0:
                raise GatewayConfigError(
                    f"limits.memory_overcommit={self.memory_overcommit}: use 1.0 (no overcommit) or more"
                )

    def __init__(
        self, config: Config, host: HostCapacity, *, defaults: Reservation, default_idle_timeout_s: float
    ) -> None:
        self.config = config
        self.host = host
        pid_max = host.pid_max or LINUX_DEFAULT_PID_MAX
        self.budget_pids = config.budget_pids or pid_max * 3 // 4
        self.budget_memory_mb = config.budget_memory_mb or int(host.memory_mb * config.memory_overcommit)
        self.budget_cpus = config.budget_cpus
        self.max_cpus = config.max_cpus or host.cpus
        self.max_memory_mb = config.max_memory_mb or self.budget_memory_mb
        self.max_pids = config.max_pids
        self.max_idle_timeout_s = config.max_idle_timeout_s
        self._held: dict[str, Reservation] = {}
        _check_host(self, pid_max)
        _check_maxima(self, defaults, default_idle_timeout_s)

    # -- asks ------------------------------------------------------------------------------------
    def check_ask(self, ask: Reservation, idle_timeout_s: float, *, source: str) -> None:
        """Raise `LimitExceeded` naming the first field of `ask` (from `source`) over its maximum."""
        maxima = (
            ("cpus", ask.cpus, self.max_cpus, "max_cpus"),
            ("memory_mb", ask.memory_mb, self.max_memory_mb, "max_memory_mb"),
            ("pids", ask.pids, self.max_pids, "max_pids"),
            ("idle_timeout_s", idle_timeout_s, self.max_idle_timeout_s, "max_idle_timeout_s"),
        )
        for field, value, limit, setting in maxima:
            if value > limit:
                raise LimitExceeded(
                    f"{source} asks {field}={_num(value)}, above this gateway's maximum of "
                    f"{_num(limit)} per session (limits.{setting}, set by its operator); ask for "
                    f"at most {_num(limit)}"
                )

    # -- the budget ------------------------------------------------------------------------------
    @property
    def in_use(self) -> Reservation:
        """What the live sandboxes hold, summed."""
        held = self._held.values()
        return Reservation(
            cpus=sum(r.cpus for r in held),
            memory_mb=sum(r.memory_mb for r in held),
            pids=sum(r.pids for r in held),
        )

    def reserve(self, sandbox_id: str, ask: Reservation) -> None:
        """Hold `ask` for `sandbox_id`, or raise `CapacityExceeded` naming the exhausted budget."""
        used = self.in_use
        budgets = (
            ("pids", used.pids + ask.pids, self.budget_pids, "budget_pids"),
            ("memory_mb", used.memory_mb + ask.memory_mb, self.budget_memory_mb, "budget_memory_mb"),
            ("cpus", used.cpus + ask.cpus, self.budget_cpus, "budget_cpus"),
        )
        for field, total, budget, setting in budgets:
            if budget is not None and total > budget:
                raise CapacityExceeded(
                    f"live sessions would hold {field}={_num(total)}, above the gateway's budget "
                    f"of {_num(budget)} (limits.{setting}); close sessions or retry later"
                )
        self._held[sandbox_id] = ask

    def transfer(self, source_id: str, target_id: str) -> None:
        """Move a reservation to another id (a warm-pool sandbox becoming a session)."""
        if source_id in self._held:
            self._held[target_id] = self._held.pop(source_id)

    def release(self, sandbox_id: str) -> None:
        """Return what `sandbox_id` held (idempotent)."""
        self._held.pop(sandbox_id, None)


def _check_host(limits: SessionLimits, pid_max: int) -> None:
    host = limits.host
    room = pid_max - PID_RESERVE
    if limits.budget_pids > room:
        raise GatewayConfigError(
            f"limits.budget_pids={limits.budget_pids} leaves the host fewer than {PID_RESERVE} of "
            f"its pid_max={pid_max} (a sandbox at its pids limit must not starve the host); use "
            f"at most {room}, or raise /proc/sys/kernel/pid_max"
        )
    memory_room = int(host.memory_mb * limits.config.memory_overcommit)
    if limits.budget_memory_mb > memory_room:
        raise GatewayConfigError(
            f"limits.budget_memory_mb={limits.budget_memory_mb} exceeds the host's memory "
            f"({host.memory_mb} MB x memory_overcommit {limits.config.memory_overcommit:g}); "
            f"use at most {memory_room}, or raise limits.memory_overcommit knowingly"
        )
    if limits.max_cpus > host.cpus:
        raise GatewayConfigError(
            f"limits.max_cpus={limits.max_cpus:g} exceeds the host's {host.cpus:g} cores; "
            f"use at most {host.cpus:g}"
        )
    if limits.budget_cpus is not None and limits.budget_cpus > host.cpus:
        raise GatewayConfigError(
            f"limits.budget_cpus={limits.budget_cpus:g} exceeds the host's {host.cpus:g} cores; "
            "use at most that, or leave it unset to let quotas oversubscribe the cores"
        )


def _check_maxima(limits: SessionLimits, defaults: Reservation, default_idle_s: float) -> None:
    pairs = (
        ("max_pids", limits.max_pids, "budget_pids", limits.budget_pids),
        ("max_memory_mb", limits.max_memory_mb, "budget_memory_mb", limits.budget_memory_mb),
        ("default_cpus", defaults.cpus, "limits.max_cpus", limits.max_cpus),
        ("default_memory_mb", defaults.memory_mb, "limits.max_memory_mb", limits.max_memory_mb),
        ("default_pids", defaults.pids, "limits.max_pids", limits.max_pids),
        ("idle_timeout_s", default_idle_s, "limits.max_idle_timeout_s", limits.max_idle_timeout_s),
    )
    for name, value, bound_name, bound in pairs:
        if value > bound:
            raise GatewayConfigError(
                f"{name}={_num(value)} is above {bound_name}={_num(bound)}; lower it or raise {bound_name}"
            )


def _num(value: float) -> str:
    """1024 rather than 1024.0 or 1.024e+03; fractions as they are."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
