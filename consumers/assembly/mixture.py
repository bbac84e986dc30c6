"""Task-aware mixture: which pooled groups go into the next batch.

Each task type gets a quota of the batch (its target ratio, rounded by largest remainder);
groups are taken oldest first within a type; what is not taken (a type's surplus) stays in the
pool for the next batch. When a type cannot fill its quota, the batch waits for it, unless
`fill_shortfall` is set or the pool has grown to `max_pool_batches` batches, in which case the
gap is filled with the oldest remaining groups of any type.
Units are groups or sequences (`batch_unit`); groups are never split.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import PositiveInt

from stacx.consumers.assembly.errors import AssemblyConfigError

__all__ = ["BatchUnit", "MixturePlanner", "PoolEntry", "quotas"]


class BatchUnit(enum.StrEnum):
    GROUPS = "groups"
    SEQUENCES = "sequences"


@dataclass(frozen=True, slots=True)
class PoolEntry:
    """One pooled group as the planner sees it."""

    key: str
    """Pool key (the group id)."""
    task_type: str
    """Task type of the group."""
    num_sequences: int
    """Sequences the group packs into (padding included)."""


def quotas(ratios: Mapping[str, float], batch_size: int) -> dict[str, int]:
    """Split `batch_size` units over task types by ratio (largest remainder, ties by name)."""
    total = sum(ratios.values())
    exact = {task: batch_size * r / total for task, r in ratios.items()}
    result = {task: math.floor(x) for task, x in exact.items()}
    left = batch_size - sum(result.values())
    by_remainder = sorted(exact, key=lambda t: (-(exact[t] - result[t]), t))
    for task in by_remainder[:left]:
        result[task] += 1
    return result


class MixturePlanner:
    """Chooses the members of the next batch from the pool, or says to wait."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        batch_size: PositiveInt = 8
        """Units per batch (see `batch_unit`)."""
        batch_unit: BatchUnit = BatchUnit.GROUPS
        """Count the batch size in whole groups or in sequences (groups are never split)."""
        task_ratios: dict[str, float] = field(default_factory=dict)
        """Target share of each task type in a batch; empty: first come, first served."""
        fill_shortfall: bool = False
        """Fill a task type's missing quota with other types at once instead of waiting."""
        max_pool_batches: float = 4.0
        """Stop waiting for a short task type once this many batches' worth is pooled."""

        def __post_init__(self) -> None:
            self.batch_unit = BatchUnit(self.batch_unit)
            self.task_ratios = {str(k): float(v) for k, v in self.task_ratios.items()}
            if self.batch_size < 1:
                raise AssemblyConfigError(f"mixture.batch_size must be >= 1, got {self.batch_size}")
            if any(r < 0 for r in self.task_ratios.values()) or (
                self.task_ratios and sum(self.task_ratios.values()) <= 0
            ):
                raise AssemblyConfigError(
                    f"mixture.task_ratios must be >= 0 with a positive sum, got {self.task_ratios}"
                )
            if self.max_pool_batches < 1:
                raise AssemblyConfigError(
                    f"mixture.max_pool_batches must be >= 1, got {self.max_pool_batches}"
                )

    def __init__(self, config: Config) -> None:
        self.config = config
        self._quotas = quotas(config.task_ratios, config.batch_size) if config.task_ratios else {}

    def units(self, entry: PoolEntry) -> int:
        return 1 if self.config.batch_unit is BatchUnit.GROUPS else entry.num_sequences

    def select(self, pool: Sequence[PoolEntry]) -> list[PoolEntry] | None:
        """Members of the next batch (pool order = arrival order), or None to wait."""
        available = sum(self.units(e) for e in pool)
        if available < self.config.batch_size:
            return None
        chosen = self._take_quotas(pool) if self._quotas else []
        taken = sum(self.units(e) for e in chosen)
        if self._is_short(pool) and not self._may_fill(available):
            return None
        chosen_keys = {e.key for e in chosen}
        for entry in pool:
            if entry.key in chosen_keys:
                continue
            if taken + self.units(entry) <= self.config.batch_size:
                chosen.append(entry)
                chosen_keys.add(entry.key)
                taken += self.units(entry)
        if not chosen:
            return None
        order = {e.key: i for i, e in enumerate(pool)}
        return sorted(chosen, key=lambda e: order[e.key])

    def _is_short(self, pool: Sequence[PoolEntry]) -> bool:
        """True when some task type has fewer pooled units than its quota."""
        pooled: dict[str, int] = {}
        for entry in pool:
            pooled[entry.task_type] = pooled.get(entry.task_type, 0) + self.units(entry)
        return any(pooled.get(task, 0) < quota for task, quota in self._quotas.items())

    def _may_fill(self, available: int) -> bool:
        pool_limit = self.config.max_pool_batches * self.config.batch_size
        return self.config.fill_shortfall or available >= pool_limit

    def _take_quotas(self, pool: Sequence[PoolEntry]) -> list[PoolEntry]:
        taken: dict[str, int] = {}
        chosen: list[PoolEntry] = []
        for entry in pool:
            quota = self._quotas.get(entry.task_type, 0)
            used = taken.get(entry.task_type, 0)
            if used + self.units(entry) <= quota:
                chosen.append(entry)
                taken[entry.task_type] = used + self.units(entry)
        return chosen
