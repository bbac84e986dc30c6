"""TaskScheduler: pending task groups by task type, ordered by a pluggable strategy.

Strategies (selected by `scheduler.strategy` in the config, never by evaluator code):
- `fifo`: arrival order across all types.
- `priority`: highest `TaskSample.priority` first, arrival order among equals.
- `fair_share`: weighted fair queuing over task types (stride scheduling on dispatched samples).
- `task_aware`: per batch of `batch_size` groups, interleave types toward target mixture ratios.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rollout.errors import ConfigError
from rollout.protocols import TaskGroup

__all__ = [
    "FairShareStrategy",
    "FifoStrategy",
    "PriorityStrategy",
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

    def dispatched(self, group: TaskGroup) -> None:
        """Bookkeeping after `group` left the scheduler."""
        ...


class FifoStrategy:
    name = "fifo"

    def select(self, queues: Queues) -> TaskGroup:
        return min((q[0] for q in queues.values() if q), key=lambda g: g.seq)

    def dispatched(self, group: TaskGroup) -> None:
        return None


class PriorityStrategy:
    name = "priority"

    def select(self, queues: Queues) -> TaskGroup:
        candidates = (g for q in queues.values() for g in q)
        return min(candidates, key=lambda g: (-g.task.priority, g.seq))

    def dispatched(self, group: TaskGroup) -> None:
        return None


class FairShareStrategy:
    """Each type gets dispatched samples in proportion to its weight (default weight 1)."""

    name = "fair_share"

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = dict(weights or {})
        for task_type, weight in self.weights.items():
            if weight <= 0:
                raise ConfigError(f"scheduler.weights.{task_type} = {weight}; use a weight > 0")
        self.served: dict[str, int] = {}

    def _finish_tag(self, group: TaskGroup) -> float:
        task_type = group.task.task_type
        served = self.served.get(task_type, 0) + group.num_samples
        return served / self.weights.get(task_type, 1.0)

    def select(self, queues: Queues) -> TaskGroup:
        heads = [q[0] for q in queues.values() if q]
        return min(heads, key=lambda g: (self._finish_tag(g), g.seq))

    def dispatched(self, group: TaskGroup) -> None:
        task_type = group.task.task_type
        self.served[task_type] = self.served.get(task_type, 0) + group.num_samples


class TaskAwareStrategy:
    """Within each batch of `batch_size` groups, pick the type furthest below its target share.

    A type whose queue is empty cannot take its share; the others fill the batch (the surplus),
    and the next batch starts from zero again. Types without a ratio go last.
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
        self.in_batch: dict[str, int] = {}

    def _deficit(self, group: TaskGroup) -> float:
        task_type = group.task.task_type
        position = sum(self.in_batch.values()) + 1
        return self.ratios.get(task_type, 0.0) * position - self.in_batch.get(task_type, 0)

    def select(self, queues: Queues) -> TaskGroup:
        heads = [q[0] for q in queues.values() if q]
        return min(heads, key=lambda g: (-self._deficit(g), g.seq))

    def dispatched(self, group: TaskGroup) -> None:
        task_type = group.task.task_type
        self.in_batch[task_type] = self.in_batch.get(task_type, 0) + 1
        if sum(self.in_batch.values()) >= self.batch_size:
            self.in_batch.clear()


def build_strategy(config: TaskScheduler.Config) -> SchedulingStrategy:
    """The strategy named by `config.strategy`."""
    if config.strategy == "fifo":
        return FifoStrategy()
    if config.strategy == "priority":
        return PriorityStrategy()
    if config.strategy == "fair_share":
        return FairShareStrategy(config.weights)
    if config.strategy == "task_aware":
        return TaskAwareStrategy(config.ratios, config.batch_size)
    raise ConfigError(
        f"scheduler.strategy = {config.strategy!r}; use one of fifo, priority, fair_share, task_aware"
    )


class TaskScheduler:
    """Pending groups, one arrival-ordered queue per task type; `pop()` asks the strategy."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        strategy: str = "fifo"
        """fifo | priority | fair_share | task_aware."""
        weights: dict[str, float] = field(default_factory=dict)
        """fair_share: weight per task type (default 1)."""
        ratios: dict[str, float] = field(default_factory=dict)
        """task_aware: target mixture ratio per task type."""
        batch_size: int = 8
        """task_aware: groups per mixture batch."""
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

    def pending_by_type(self) -> dict[str, int]:
        return {t: len(q) for t, q in self.queues.items() if q}

    def __len__(self) -> int:
        return self.num_pending
