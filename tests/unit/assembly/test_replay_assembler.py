"""`ReplayAssembler`: the assembler's stages on record time, a deterministic function of the range."""

from __future__ import annotations

import pytest

from consumers.assembly.testing import make_trajectory
from consumers.replay import RangeRecord, ReplayAssembler, ReplayRange
from infra.config import build
from schemas.codec import Codec, decode, encode
from schemas.records import TrainingBatch


def _records() -> list[RangeRecord]:
    trajs = [make_trajectory(f"g{g}", s) for s in range(2) for g in range(3)]
    trajs = trajs[:-1]  # g2 misses a sample: it closes when the range ends
    return [
        RangeRecord(i % 2, i, 1_000 + 10 * i, t.group_id.encode(), encode(t)) for i, t in enumerate(trajs)
    ]


def _assemble(records: list[RangeRecord]) -> list[tuple[str, bytes]]:
    config = build(
        ReplayAssembler.Config, {"grouping": {"group_size": 2}, "mixture": {"batch_size": 1}}, where="x"
    )
    return ReplayAssembler(config, Codec()).assemble(records).batches


def test_same_range_gives_the_same_batch_bytes_and_open_groups_close_at_the_end() -> None:
    first, second = _assemble(_records()), _assemble(_records())
    assert first == second and len(first) == 3
    last = decode(first[-1][1])
    assert isinstance(last, TrainingBatch) and last.group_ids == ["g2"]
    assert decode(first[0][1]).created_at_ms == 1_000 + 10 * 3  # the record time that completed g0


def test_a_range_names_one_start_and_one_end() -> None:
    with pytest.raises(ValueError, match="from_offset or from_timestamp_ms"):
        ReplayRange(topic="t", from_offset=0, from_timestamp_ms=1)
    with pytest.raises(ValueError, match="to_offset=-1"):
        ReplayRange(topic="t", to_offset=-1)


def test_shipped_replay_and_many_learner_configs_load() -> None:
    from pathlib import Path

    from consumers.assembly.app import AssemblerApp
    from consumers.learner_feed import KeepRule, LearnerFeed
    from infra.config import load_yaml
    from infra.replay import ReplayFile
    from trainer import TrainerConfig

    root = Path(__file__).resolve().parents[3] / "examples" / "replay"
    replay = build(ReplayFile, load_yaml(root / "grpo_tiny.yaml"), where="grpo_tiny.yaml")
    build(TrainerConfig, replay.trainer, where="grpo_tiny.yaml: trainer")
    many = load_yaml(root / "many_learners.yaml")
    build(AssemblerApp.Config, {**many["assembler"], "partitions": 8}, where="many_learners.yaml: assembler")
    learners = [build(LearnerFeed.Config, v, where=k) for k, v in many["learners"].items()]
    assert [f.keep for f in learners] == [KeepRule.ALL, KeepRule.SUCCESSFUL]
    assert len({f.group_id for f in learners} | {many["assembler"]["app_id"]}) == 3
