"""Task-aware mixture: quotas, surplus carried over, waiting and filling."""

from __future__ import annotations

import pytest

from stacx.consumers.assembly import AssemblyConfigError, MixturePlanner, PoolEntry, quotas


def _pool(*types: str, size: int = 1) -> list[PoolEntry]:
    return [PoolEntry(f"{t}{i}", t, size) for i, t in enumerate(types)]


def test_quotas_use_largest_remainder() -> None:
    assert quotas({"a": 1, "b": 1}, 4) == {"a": 2, "b": 2}
    assert quotas({"a": 2, "b": 1}, 4) == {"a": 3, "b": 1}
    assert quotas({"a": 1, "b": 1, "c": 1}, 4) == {"a": 2, "b": 1, "c": 1}
    assert sum(quotas({"a": 0.3, "b": 0.7}, 7).values()) == 7


def test_fifo_without_ratios() -> None:
    planner = MixturePlanner(MixturePlanner.Config(batch_size=2))
    pool = _pool("a", "b", "a")
    assert [e.key for e in planner.select(pool) or []] == ["a0", "b1"]
    assert planner.select(pool[:1]) is None


def test_ratio_is_respected_and_surplus_stays_in_the_pool() -> None:
    planner = MixturePlanner(MixturePlanner.Config(batch_size=4, task_ratios={"a": 1, "b": 1}))
    pool = _pool("a", "a", "a", "a", "b", "b", "b")
    chosen = planner.select(pool) or []
    assert [e.key for e in chosen] == ["a0", "a1", "b4", "b5"]
    rest = [e for e in pool if e not in chosen]
    assert [e.key for e in rest] == ["a2", "a3", "b6"]
    assert planner.select(rest) is None  # carried surplus waits for more b


def test_short_type_waits_unless_filling_or_pool_is_full() -> None:
    strict = MixturePlanner(
        MixturePlanner.Config(batch_size=2, task_ratios={"a": 1, "b": 1}, max_pool_batches=2)
    )
    assert strict.select(_pool("a", "a")) is None
    assert [e.key for e in strict.select(_pool("a", "a", "a", "a")) or []] == ["a0", "a1"]
    filling = MixturePlanner(
        MixturePlanner.Config(batch_size=2, task_ratios={"a": 1, "b": 1}, fill_shortfall=True)
    )
    assert [e.key for e in filling.select(_pool("a", "a")) or []] == ["a0", "a1"]


def test_sequence_units_never_split_groups() -> None:
    planner = MixturePlanner(MixturePlanner.Config(batch_size=10, batch_unit="sequences"))
    pool = _pool("a", "a", "a", size=4)
    chosen = planner.select(pool) or []
    assert [e.key for e in chosen] == ["a0", "a1"]  # 8 sequences; a third group would be 12
    assert planner.select(pool[:2]) is None  # 8 < 10: wait for more material


def test_invalid_config_names_the_field() -> None:
    with pytest.raises(AssemblyConfigError, match="mixture.batch_size"):
        MixturePlanner.Config(batch_size=0)
    with pytest.raises(AssemblyConfigError, match="mixture.task_ratios"):
        MixturePlanner.Config(task_ratios={"a": -1.0})
    with pytest.raises(ValueError):
        MixturePlanner.Config(batch_unit="tokens")
