"""`stacx replay` on the real broker: two replays of one retained trajectories topic with the
same settings give the same batch ids, the same batch bytes and bit-identical CPU weights; a
third with another recipe runs to completion, each in a run (topics, groups) of its own."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from run_names import run_name

from stacx.consumers.assembly.testing import make_trajectory
from stacx.infra.config import build
from stacx.infra.replay import ReplayFile, run_replay
from stacx.infra.services import topic_admin
from stacx.schemas.codec import encode

TRAINER: dict[str, Any] = {
    "recipe": "grpo",
    "seed": 3,
    "models": {"policy": {"tiny": {"vocab_size": 512}, "seed": 0}},
    "optimizer": {"lr": 1.0e-3, "warmup_steps": 1},
    "backend": {"kind": "single", "device": "cpu"},
    "source": {"idle_timeout_s": 5},
    "export": {"model_name": "policy", "every_steps": 1},
}


@pytest.fixture
def replay_runs(kafka_bootstrap: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        try:
            topic_admin.delete_run(kafka_bootstrap, name)
        except Exception:  # a replay that failed before creating its topics
            pass


def _publish_groups(bootstrap: str, topic: str, num_groups: int, group_size: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "lz4"}
    )
    for s in range(group_size):  # interleaved, as concurrent rollouts write them
        for g in range(num_groups):
            t = make_trajectory(f"g{g}", s, num_completion=2 + (g + s) % 3)
            producer.produce(topic, key=t.group_id.encode(), value=encode(t))
    assert producer.flush(30) == 0


def _replay(bootstrap: str, source: str, name: str, tmp_path: Path, **trainer: Any) -> dict[str, Any]:
    tree = {
        "bootstrap_servers": bootstrap,
        "replay": {"name": name, "source_topic": source, "runs_dir": str(tmp_path / "runs")},
        "assembler": {"grouping": {"group_size": 4}, "mixture": {"batch_size": 2}},
        "trainer": {**TRAINER, **trainer},
    }
    return run_replay(build(ReplayFile, tree, where="replay"), base_dir=tmp_path)


def test_two_replays_are_identical_and_another_recipe_completes(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, replay_runs: list[str]
) -> None:
    source = fresh_topic("replay-traj", partitions=4)
    _publish_groups(kafka_bootstrap, source, num_groups=6, group_size=4)
    tag = uuid.uuid4().hex[:6]
    replay_runs += [run_name(f"replay-a-{tag}"), run_name(f"replay-b-{tag}"), run_name(f"replay-sft-{tag}")]

    first = _replay(kafka_bootstrap, source, replay_runs[0], tmp_path)
    second = _replay(kafka_bootstrap, source, replay_runs[1], tmp_path)
    assert first["records"] == 24 and first["batches"] == 3
    assert first["batch_ids"] == second["batch_ids"]
    assert first["batch_sha256"] == second["batch_sha256"]
    assert first["final_weights"] is not None and first["final_weights"]["version"] == 3
    assert first["final_weights"]["content_hash"] == second["final_weights"]["content_hash"]
    assert first["weights_topic"] != second["weights_topic"]  # each replay is its own run

    other = _replay(kafka_bootstrap, source, replay_runs[2], tmp_path, recipe="sft")
    assert other["batch_ids"] == first["batch_ids"] and other["recipe"] == "sft"
    assert other["final_weights"] is not None
    assert other["final_weights"]["content_hash"] != first["final_weights"]["content_hash"]


def test_replayed_batches_carry_headers_and_the_trainer_steps_continue_the_source_traces(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, replay_runs: list[str]
) -> None:
    from opentelemetry import trace
    from tracing_fixtures import in_memory_tracing

    from stacx.consumers.replay import ReplayRange, read_range
    from stacx.producers.tracing import TRACEPARENT, context_from_headers
    from stacx.schemas.codec import CONTENT_TYPE_HEADER, SINGLE_OBJECT_CONTENT_TYPE

    source = fresh_topic("replay-traced", partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    episodes: dict[str, str] = {}  # trajectory id -> trace id of the episode that made it
    with in_memory_tracing() as spans:
        tracer = trace.get_tracer("test.rollout")
        for s in range(4):
            for g in range(2):
                t = make_trajectory(f"g{g}", s)
                with tracer.start_as_current_span("episode") as episode:
                    headers = [(TRACEPARENT, _traceparent(episode))]
                episodes[t.trajectory_id] = f"{episode.get_span_context().trace_id:032x}"
                producer.produce(source, key=t.group_id.encode(), value=encode(t), headers=headers)
        producer.produce(source, key=b"g0", value=b"\xc3\x01 garbage")  # left out, counted
        assert producer.flush(30) == 0
        replay_runs.append(f"replay-traced-{uuid.uuid4().hex[:6]}")
        summary = _replay(kafka_bootstrap, source, replay_runs[-1], tmp_path)
        finished = spans.get_finished_spans()
    assert summary["undecodable"] == 1 and summary["assembler_stats"]["undecodable"] == 1
    batches = read_range(kafka_bootstrap, ReplayRange(topic=f"stacx.batches.{replay_runs[-1]}"))
    assert len(batches) == summary["batches"] == 1  # both groups of 4 in one batch of 2 groups
    batch_spans = {f"{s.context.span_id:016x}": s for s in finished if s.name == "assembler.batch"}
    for record in batches:
        headers = dict(record.headers)
        assert headers[CONTENT_TYPE_HEADER] == SINGLE_OBJECT_CONTENT_TYPE.encode()
        carried = trace.get_current_span(context_from_headers([(TRACEPARENT, headers[TRACEPARENT])]))
        span = batch_spans[f"{carried.get_span_context().span_id:016x}"]
        traces = {f"{span.context.trace_id:032x}"} | {f"{link.context.trace_id:032x}" for link in span.links}
        assert traces == set(episodes.values())  # continues one episode's trace, links the 7 others
    steps = [s for s in finished if s.name == "trainer.step"]
    assert steps and all(s.parent is not None for s in steps)  # no new root traces
    assert {f"{s.context.trace_id:032x}" for s in steps} <= set(episodes.values())


def _traceparent(span: Any) -> bytes:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01".encode()
