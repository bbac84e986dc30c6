"""TaskScheduler: pending task groups by task type, ordered by a pluggable strategy.

Strategies (selected by `scheduler.strategy` in the config, never by evaluator code):
- `fifo`: arrival order across all types.
- `priority`: highest `TaskSample.priority` first, arrival order among equals.
- `fair_share`: start-time fair queuing over task types, weighted, counted in samples. A type
  that arrives (or comes back) starts at the current virtual time, so it gets its share at once
  but no credit for the time it was absent: a newcomer never monopolises dispatch.
- `task_aware`: a smooth weighted round robin toward target mixture ratios whose remainder
  carries across batches (0.7/0.3 stays 0.7/0.3, and a 5% type is scheduled once in 20); a
  type without pending work leaves its turns to the others and owes or is owed nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from stacx.rollout.errors import ConfigError
from stacx.rollout.protocols import TaskGroup
from stacx.schemas.plugins import PluginError, Registry, accepts

__all__ = [
    "FairShareStrategy",
    "FifoStrategy",
    "PriorityStrategy",
    "STRATEGIES",
    "SchedulingStrategy",
    "TaskAwareStrategy",
    "TaskScheduler",
    "build_strategy",
]

Queues = Mapping[str, deque[TaskGroup]]


class SchedulingStrategy(Protocol):
    """Chooses the next group among the non-empty per-type queues (arrival-ordered)."""

    name: str

    def select(self, queues: Queues) -> TaskGroup: ...

    def arrived(self, group: TaskGroup, queues: Queues) -> None:
        """Bookkeeping after `group` was queued (it is already the last of its type's queue)."""
        ...

    def dispatched(self, group: TaskGroup) -> None:
        """Bookkeeping after `group` left the scheduler."""
        ...


class FifoStrategy:
    name = "fifo"

    def select(self, queues: Queues) -> TaskGroup:
        return min((q[0] for q in queues.values() if q), key=lambda g: g.seq)

    def arrived(self, group: TaskGroup, queues: Queues) -> None:
        return None

    def dispatched(self, group: TaskGroup) -> None:
        return None


class PriorityStrategy:
    name = "priority"

    def select(self, queues: Queues) -> TaskGroup:
        candidates = (g for q in queues.values() for g in q)
        return min(candidates, key=lambda g: (-g.task.priority, g.seq))

    def arrived(self, group: TaskGroup, queues: Queues) -> None:
        return None

    def dispatched(self, group: TaskGroup) -> None:
        return None


class FairShareStrategy:
    """Each backlogged type gets dispatched samples in proportion to its weight (default 1).

    Start-time fair queuing: a group's start tag is the larger of the virtual time when it
    arrived and the finish tag of its type's previous group; its finish tag adds
    `num_samples / weight`. The group with the smallest finish tag goes first; the virtual time
    is the start tag of the last dispatched group. Lifetime counts would let a newcomer take
    every dispatch until it caught up with the others' history; tags from the virtual time give
    it its share from the moment it arrives.
    """

    name = "fair_share"

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = dict(weights or {})
        for task_type, weight in self.weights.items():
            if weight <= 0:
                raise ConfigError(f"scheduler.weights.{task_type} = {weight}; use a weight > 0")
        self.virtual_time = 0.0
        self._last_finish: dict[str, float] = {}
        self._tags: dict[int, tuple[float, float]] = {}
        """Group seq -> (start tag, finish tag)."""

    def arrived(self, group: TaskGroup, queues: Queues) -> None:
        task_type = group.task.task_type
        start = max(self.virtual_time, self._last_finish.get(task_type, 0.0))
        finish = start + group.num_samples / self.weights.get(task_type, 1.0)
        self._last_finish[task_type] = finish
        self._tags[group.seq] = (start, finish)

    def select(self, queues: Queues) -> TaskGroup:
        heads = [q[0] for q in queues.values() if q]
        return min(heads, key=lambda g: (self._tags[g.seq][1], g.seq))

    def dispatched(self, group: TaskGroup) -> None:
        start, _ = self._tags.pop(group.seq)
        self.virtual_time = max(self.virtual_time, start)


class TaskAwareStrategy:
    """Interleave types toward target mixture ratios, carrying the remainder across batches.

    Smooth weighted round robin: before each pick every type with pending work earns its ratio
    (renormalised over the types with work) in credit; the one with the most credit goes (ties:
    earlier arrival) and pays one. Credit is never reset, so the fractional remainder carries
    from batch to batch and the long-run mixture is exactly the ratios (0.7/0.3 stays 0.7/0.3; a
    5% type goes once every 20 picks). A type without pending work earns nothing and the
    others share its turn (the surplus) without running into debt, so when it comes back it
    gets its ratio from then on: no catch-up burst and no monopoly. Types without a ratio go
    last.
    """

    name = "task_aware"

    def __init__(self, ratios: Mapping[str, float], batch_size: int) -> None:
        if not ratios:
            raise ConfigError("scheduler.ratios is empty; task_aware needs a ratio per task type")
        if batch_size < 1:
            raise ConfigError(f"scheduler.batch_size = {batch_size}; use >= 1")
        total = sum(ratios.values())
        if total <= 0 or any(r < 0 for r in ratios.values()):
            raise ConfigError(f"scheduler.ratios {dict(ratios)} must be >= 0 and sum to > 0")
        self.ratios = {t: r / total for t, r in ratios.items()}
        self.batch_size = batch_size
        self.credit: dict[str, float] = dict.fromkeys(self.ratios, 0.0)
        self._earned = False

    def arrived(self, group: TaskGroup, queues: Queues) -> None:
        return None

    def select(self, queues: Queues) -> TaskGroup:
        if not self._earned:  # once per pick, however often select is asked
            self._earn(queues)
        heads = [q[0] for q in queues.values() if q]
        return min(heads, key=lambda g: (-self.credit.get(g.task.task_type, float("-inf")), g.seq))

    def _earn(self, queues: Queues) -> None:
        present = [t for t in self.ratios if queues.get(t)]
        total = sum(self.ratios[t] for t in present)
        for task_type in present if total > 0 else ():
            self.credit[task_type] += self.ratios[task_type] / total
        self._earned = True

    def dispatched(self, group: TaskGroup) -> None:
        task_type = group.task.task_type
        if task_type in self.credit:
            self.credit[task_type] -= 1.0
        self._earned = False


StrategyFactory = Callable[["TaskScheduler.Config"], SchedulingStrategy]
"""Builds a strategy from the scheduler's config (`strategy_options` are keyword options)."""


def _check(factory: Any) -> str | None:
    return accepts(factory, TaskScheduler.Config())


STRATEGIES: Registry[StrategyFactory] = Registry("strategies", what="scheduling strategy", check=_check)
"""Scheduling strategies by name: `factory(config, **strategy_options) -> SchedulingStrategy`."""
for _name, _factory in (
    ("fifo", lambda config: FifoStrategy()),
    ("priority", lambda config: PriorityStrategy()),
    ("fair_share", lambda config: FairShareStrategy(config.weights)),
    ("task_aware", lambda config: TaskAwareStrategy(config.ratios, config.batch_size)),
):
    STRATEGIES.add(_name, _factory, origin="builtin (stacx.rollout.scheduler)")


def build_strategy(config: TaskScheduler.Config) -> SchedulingStrategy:
    """The strategy named by `config.strategy`."""
    try:
        strategy = STRATEGIES.build(config.strategy, config, options_field="strategy_options",
                                    **config.strategy_options)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    missing = [m for m in ("select", "arrived", "dispatched") if not callable(getattr(strategy, m, None))]
    if missing:
        raise ConfigError(f"{config.strategy!r}: the strategy it built lacks {', '.join(missing)}")
    return strategy


class TaskScheduler:
    """Pending groups, one arrival-ordered queue per task type; `pop()` asks the strategy."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        strategy: str = "fifo"
        """fifo | priority | fair_share | task_aware, `package.module:factory`, or an entry point
        in `stacx.strategies`."""
        strategy_options: dict[str, Any] = field(default_factory=dict)
        """Keyword options of a plug-in strategy's factory."""
        weights: dict[str, float] = field(default_factory=dict)
        """fair_share: weight per task type (default 1)."""
        ratios: dict[str, float] = field(default_factory=dict)
        """task_aware: target mixture ratio per task type."""
        batch_size: int = 8
        """task_aware: accepted from older configs; the ratios now hold across batches, so it no
        longer changes the order."""
        lookahead: int = 64
        """Groups kept pending so the strategy has a choice."""

    def __init__(self, config: Config | None = None, strategy: SchedulingStrategy | None = None):
        self.config = config or TaskScheduler.Config()
        self.strategy = strategy or build_strategy(self.config)
        self.queues: dict[str, deque[TaskGroup]] = {}
        self._seq = 0
        self.num_pending = 0

    def push(self, group: TaskGroup) -> None:
        group.seq = self._seq
        self._seq += 1
        self.queues.setdefault(group.task.task_type, deque()).append(group)
        self.num_pending += 1
        self.strategy.arrived(group, self.queues)

    def pop(self) -> TaskGroup | None:
        if not self.num_pending:
            return None
        group = self.strategy.select(self.queues)
        queue = self.queues[group.task.task_type]
        if queue[0] is group:
            queue.popleft()
        else:
            queue.remove(group)
        self.num_pending -= 1
        self.strategy.dispatched(group)
        return group

    def drop(self, unwanted: Callable[[TaskGroup], bool]) -> int:
        """Remove the pending groups `unwanted` selects (their tasks moved to another worker);
        how many. The strategy is not told: a dropped group was never dispatched here."""
        dropped = 0
        for task_type, queue in self.queues.items():
            kept = deque(g for g in queue if not unwanted(g))
            dropped += len(queue) - len(kept)
            self.queues[task_type] = kept
        self.num_pending -= dropped
        return dropped

    def pending_by_type(self) -> dict[str, int]:
        return {t: len(q) for t, q in self.queues.items() if q}

    def __len__(self) -> int:
        return self.num_pending
