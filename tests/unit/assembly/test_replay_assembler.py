"""`ReplayAssembler`: the assembler's stages on record time, a deterministic function of the range."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from stacx.consumers.assembly.testing import make_trajectory
from stacx.consumers.replay import RangeRecord, ReplayAssembler, ReplayRange
from stacx.infra.config import build
from stacx.producers.event_producer import registry_client
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import Codec, decode, encode
from stacx.schemas.records import TrainingBatch


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

    from stacx.consumers.assembly.app import AssemblerApp
    from stacx.consumers.learner_feed import KeepRule, LearnerFeed
    from stacx.infra.config import load_yaml
    from stacx.infra.replay import ReplayFile
    from stacx.trainer import TrainerConfig

    root = Path(__file__).resolve().parents[3] / "examples" / "replay"
    replay = build(ReplayFile, load_yaml(root / "grpo_tiny.yaml"), where="grpo_tiny.yaml")
    build(TrainerConfig, replay.trainer, where="grpo_tiny.yaml: trainer")
    many = load_yaml(root / "many_learners.yaml")
    build(AssemblerApp.Config, {**many["assembler"], "partitions": 8}, where="many_learners.yaml: assembler")
    learners = [build(LearnerFeed.Config, v, where=k) for k, v in many["learners"].items()]
    assert [f.keep for f in learners] == [KeepRule.ALL, KeepRule.SUCCESSFUL]
    assert len({f.group_id for f in learners} | {many["assembler"]["app_id"]}) == 3


def test_records_left_out_are_counted_in_the_stats_the_summary_shows() -> None:
    records = _records()
    garbage = RangeRecord(0, 99, 1_005, b"g0", b"not an event")
    config = build(
        ReplayAssembler.Config, {"grouping": {"group_size": 2}, "mixture": {"batch_size": 1}}, where="x"
    )
    invalid = RangeRecord(0, 100, 1_006, b"g1", encode(make_trajectory("", 0)))
    result = ReplayAssembler(config, Codec()).assemble([records[0], garbage, invalid, *records[1:]])
    assert result.undecodable == 2 and result.stats["undecodable"] == 2
    assert [b for b, _ in result.batches] == [b for b, _ in _assemble(records)]  # the rest as before


def test_replayed_batches_carry_their_content_type_and_a_span_linked_to_every_trajectory() -> None:
    from opentelemetry import trace
    from tracing_fixtures import in_memory_tracing

    from stacx.producers.tracing import TRACEPARENT, context_from_headers, trace_headers
    from stacx.schemas.codec import CONTENT_TYPE_HEADER, SINGLE_OBJECT_CONTENT_TYPE

    config = build(
        ReplayAssembler.Config, {"grouping": {"group_size": 2}, "mixture": {"batch_size": 2}}, where="x"
    )
    with in_memory_tracing() as spans:
        tracer = trace.get_tracer("test.rollout")
        records = []
        sources: dict[str, trace.SpanContext] = {}
        for i, record in enumerate(_records()[:4]):  # g0 whole, g1 and g2 with one sample each
            with tracer.start_as_current_span(f"episode {i}") as episode:
                headers = tuple(trace_headers())
            trajectory = decode(record.value)
            sources[trajectory.trajectory_id] = episode.get_span_context()
            records.append(RangeRecord(record.partition, record.offset, record.timestamp_ms,
                                       record.key, record.value, headers))  # fmt: skip
        result = ReplayAssembler(config, Codec()).assemble(records)
    ((batch_id, value),) = result.batches
    headers = dict(result.headers[batch_id])
    assert headers[CONTENT_TYPE_HEADER] == SINGLE_OBJECT_CONTENT_TYPE.encode()
    carried = trace.get_current_span(context_from_headers([(TRACEPARENT, headers[TRACEPARENT])]))
    (span,) = [s for s in spans.get_finished_spans() if s.name == "assembler.batch"]
    assert carried.get_span_context().span_id == span.context.span_id
    assert span.attributes is not None and span.attributes["stacx.batch_id"] == batch_id
    batch = decode(value)
    first, *others = batch.trajectory_ids
    assert span.parent is not None and span.parent.trace_id == sources[first].trace_id
    assert {link.context.span_id for link in span.links} == {sources[t].span_id for t in others}
    assert len(others) == 2  # g0 complete, with g1's first sample (timed out at the range end)


def test_the_summary_counts_every_record_and_the_largest_token_id() -> None:
    config = build(
        ReplayAssembler.Config, {"grouping": {"group_size": 2}, "mixture": {"batch_size": 1}}, where="x"
    )
    result = ReplayAssembler(config, Codec()).assemble(_records())
    counts = {k: result.stats[k] for k in ("trajectories", "kept", "groups_complete", "groups_timed_out",
                                           "batches", "sequences")}  # fmt: skip
    assert counts == {"trajectories": 5, "kept": 5, "groups_complete": 2, "groups_timed_out": 1,
                      "batches": 3, "sequences": 5}  # fmt: skip
    assert result.max_token_id == 151  # sample 1's last completion token
    assert ReplayAssembler(config, Codec()).assemble([]).max_token_id == -1


def test_open_groups_time_out_at_the_end_in_clock_steps_of_record_time() -> None:
    # a timeout that is no multiple of the clock step still closes the group
    settings = {"grouping": {"group_size": 2, "group_timeout_s": 7, "max_clock_step_s": 5},
                "mixture": {"batch_size": 1}}  # fmt: skip
    config = build(ReplayAssembler.Config, settings, where="x")
    batches = ReplayAssembler(config, Codec()).assemble(_records()).batches
    last = decode(batches[-1][1])
    # g2's only sample came at 1,020 ms, the range ended at 1,040 ms: closed at the second step
    assert len(batches) == 3 and last.group_ids == ["g2"] and last.created_at_ms == 1_040 + 2 * 5_000


def test_an_undecodable_record_is_logged_with_its_position(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    config = build(ReplayAssembler.Config, {"grouping": {"group_size": 2}}, where="x")
    with caplog.at_level(logging.WARNING, logger="stacx.consumers.replay"):
        ReplayAssembler(config, Codec()).assemble([RangeRecord(1, 99, 1_005, b"g0", b"not an event")])
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("replay: undecodable record at partition 1 offset 99: ")
    assert not message.endswith(": None")  # the decoding error is named


def test_the_replay_reads_and_writes_with_its_codec_and_claim_checks_under_the_batches_topic(
    tmp_path: Path,
) -> None:
    codec = Codec(registry=registry_client(f"mock://replay-{uuid.uuid4().hex[:8]}"))  # Confluent framing
    trajs = [make_trajectory("g0", s, num_completion=200) for s in range(2)]  # a batch over 1 KiB
    records = [RangeRecord(0, i, 1_000 + i, b"g0", codec.encode(t)) for i, t in enumerate(trajs)]
    settings: dict[str, Any] = {"grouping": {"group_size": 2}, "mixture": {"batch_size": 1}}
    result = ReplayAssembler(build(ReplayAssembler.Config, settings, where="x"), codec).assemble(records)
    assert result.undecodable == 0
    ((_, value),) = result.batches
    assert value[:1] == b"\x00"  # the registry's framing, as the live assembler would write
    batch = codec.decode(value)
    assert isinstance(batch, TrainingBatch) and batch.group_ids == ["g0", "g0"]  # one per row
    settings["output"] = {"claim_check_threshold_bytes": 1024, "blob_store_url": str(tmp_path)}
    config = build(ReplayAssembler.Config, settings, where="x")
    ((_, value),) = ReplayAssembler(config, codec, batches_topic="unit.batches").assemble(records).batches
    claim = codec.decode(value)
    assert isinstance(claim, ClaimCheck) and claim.uri.startswith(tmp_path.as_uri() + "/unit.batches/")


def test_a_learner_feed_without_partitions_has_no_lag_yet() -> None:
    """`lag()` said 0 for a member the group had not given a partition yet."""
    from stacx.consumers.learner_feed import LearnerFeed

    class Source:
        assigned: list[tuple[str, int]] = []

        def assignment(self) -> list[tuple[str, int]]:
            return self.assigned

        def total_lag(self) -> int:
            return 0

    source = Source()
    feed = LearnerFeed(LearnerFeed.Config(group_id="g"), source=source)  # type: ignore[arg-type]
    assert feed.lag() is None
    source.assigned = [("t", 0)]
    assert feed.lag() == 0
