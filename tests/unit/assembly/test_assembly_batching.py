"""Stage 2 on plain dicts: mixture across models, stale eviction, state cleanup."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import pytest

from stacx.consumers.assembly import (
    AssemblyStats,
    BatchBuilder,
    MixturePlanner,
    ReadyGroup,
    SampleFilter,
    encode_group,
)
from stacx.consumers.assembly.testing import ReadCountingTable, make_trajectory
from stacx.schemas.codec import encode


def _group(group_id: str, *, model: str = "policy", task: str = "math", version: int = 0) -> bytes:
    trajs = [
        make_trajectory(group_id, i, model_name=model, task_type=task, policy_version=version)
        for i in range(2)
    ]
    return encode_group(
        ReadyGroup(
            group_id=group_id,
            model_name=model,
            task_type=task,
            group_size=2,
            min_policy_version=version,
            payloads=[encode(t) for t in trajs],
        )
    )


def _builder(latest: dict[str, int] | None = None, **mixture: Any) -> tuple[BatchBuilder, dict]:
    state: dict[str, Any] = {"pool": {}, "index": {}, "packed": {}}
    builder = BatchBuilder(
        BatchBuilder.Config(packed_ttl_s=10),
        planner=MixturePlanner(MixturePlanner.Config(**mixture)),
        sample_filter=SampleFilter(SampleFilter.Config(max_staleness=1), {} if latest is None else latest),
        stats=AssemblyStats(),
        **state,
    )
    return builder, state


def test_batches_never_mix_models() -> None:
    builder, state = _builder(batch_size=2)
    assert builder.on_group(_group("a", model="m1"), now_ms=1) == []
    assert builder.on_group(_group("b", model="m2"), now_ms=1) == []
    (batch,) = builder.on_group(_group("c", model="m1"), now_ms=1)
    assert batch.model_name == "m1" and set(batch.group_ids) == {"a", "c"}
    assert list(state["pool"]) == ["b"] and set(state["packed"]) == {"a", "c"}


def test_mixture_by_task_type_carries_surplus() -> None:
    builder, _ = _builder(batch_size=2, task_ratios={"math": 1, "code": 1})
    assert builder.on_group(_group("m1"), now_ms=1) == []
    assert builder.on_group(_group("m2"), now_ms=1) == []
    (batch,) = builder.on_group(_group("c1", task="code"), now_ms=1)
    assert sorted(set(batch.group_ids)) == ["c1", "m1"]
    (batch2,) = builder.on_group(_group("c2", task="code"), now_ms=1)
    assert sorted(set(batch2.group_ids)) == ["c2", "m2"]


def test_pooled_groups_that_become_stale_are_evicted() -> None:
    latest: dict[str, int] = {}
    builder, state = _builder(latest, batch_size=2)
    builder.on_group(_group("old", version=0), now_ms=1)
    latest["policy"] = 5
    assert builder.on_group(_group("new", version=5), now_ms=1) == []
    assert list(state["pool"]) == ["new"] and state["index"]["policy"][0][0] == "new"
    assert builder.on_group(_group("late", version=1), now_ms=1) == []  # stale on arrival


def test_a_group_dropped_whole_says_so_in_one_line_the_chaos_audit_reads(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """Each group the staleness filter drops (from the pool, or on arrival) is one line naming it;
    the chaos audit counts its samples as filtered, not lost."""
    latest: dict[str, int] = {}
    builder, _ = _builder(latest, batch_size=2)
    builder.on_group(_group("old", version=0), now_ms=1)
    latest["policy"] = 5
    with caplog.at_level(logging.INFO, logger="stacx.consumers.assembly"):
        builder.on_group(_group("new", version=5), now_ms=1)
        builder.on_group(_group("late", version=1), now_ms=1)
        builder.on_group(_group("fresh", version=4), now_ms=1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["group old of policy dropped: went stale in the pool (oldest policy version 0)",
                     "group late of policy dropped: stale on arrival (oldest policy version 1)"]
    log = tmp_path / "assembler.log"  # as the Faust worker writes it
    log.write_text("".join(f"[2026-12-02 06:49:42,744] [29421] [INFO] {line}\n" for line in lines))
    chaos_py = Path(__file__).parents[3] / "bench" / "chaos.py"
    spec = importlib.util.spec_from_file_location("bench_chaos_drops", chaos_py)
    assert spec is not None and spec.loader is not None
    chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos)
    assert chaos.dropped_groups(log) == {"old": "went stale in the pool", "late": "stale on arrival"}


def test_packed_ids_expire_after_the_ttl() -> None:
    builder, state = _builder(batch_size=1)
    builder.on_group(_group("a"), now_ms=1_000)
    builder.on_group(_group("b"), now_ms=20_000)
    assert set(state["packed"]) == {"b"}


def test_forgetting_packed_ids_touches_only_the_due_ones() -> None:
    packed = ReadCountingTable()
    builder = BatchBuilder(
        BatchBuilder.Config(packed_ttl_s=10),
        planner=MixturePlanner(MixturePlanner.Config(batch_size=1)),
        sample_filter=SampleFilter(SampleFilter.Config(), {}),
        pool={}, index={}, packed=packed, stats=AssemblyStats(),
    )  # fmt: skip
    for g in range(100):
        builder.on_group(_group(f"g{g}"), now_ms=1_000)
    packed.reads = 0
    for g in range(100, 110):  # ten batches, no mark due
        builder.on_group(_group(f"g{g}"), now_ms=2_000)
    assert packed.reads <= 2 * 10  # the redelivery check of each group
    packed.reads = 0
    builder.on_group(_group("late"), now_ms=11_000)  # the first 100 marks are due
    assert packed.reads <= 2 + 100 and len(packed) == 11
