"""`stacx export` then `stacx import` on the real broker: every field of every event survives,
with its headers, timestamp and partition (a replay of the imported topic gives the source's
batches); pandas reads the exported file; an undecodable record is left out, and said where."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from confluent_kafka import Producer

from stacx.consumers.assembly.testing import make_trajectory
from stacx.consumers.replay import ReplayAssembler, ReplayRange, read_range
from stacx.infra.config import build
from stacx.schemas.codec import Codec, encode
from stacx.schemas.records import ToolCall, TrajectoryStatus, Turn, token_ids

REPO = Path(__file__).resolve().parents[3]


def _stacx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stacx.infra.cli", *args],
        cwd=REPO, capture_output=True, text=True, timeout=180
    )


def test_export_then_import_preserves_every_event(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    source, target = fresh_topic("export-src", partitions=2), fresh_topic("import-dst", partitions=2)
    events = [make_trajectory(f"g{i % 3}", i, reward=i / 10) for i in range(9)]
    events[4].turns = [Turn(role="assistant", text="x", token_ids=token_ids([1, 2]),
                            tool_calls=[ToolCall(id="1", name="sh", arguments="ls")])]  # fmt: skip
    events[5].status, events[5].error, events[5].metadata = TrajectoryStatus.TIMED_OUT, "slow", {"k": "v"}
    events[6].rewards = {"exact": 1.0, "format": 0.0}
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for e in events:
        producer.produce(source, key=e.group_id.encode(), value=encode(e))
    assert producer.flush(30) == 0
    dest = tmp_path / "traj.parquet"

    exported = _stacx("export", source, str(dest), "--bootstrap", kafka_bootstrap)
    assert exported.returncode == 0, exported.stderr
    frame = pd.read_parquet(dest)
    assert len(frame) == 9 and set(frame["trajectory_id"]) == {e.trajectory_id for e in events}
    imported = _stacx("import", str(dest), target, "--bootstrap", kafka_bootstrap)
    assert imported.returncode == 0, imported.stderr

    before = {r.value for r in read_range(kafka_bootstrap, ReplayRange(topic=source))}
    after = read_range(kafka_bootstrap, ReplayRange(topic=target))
    assert {r.value for r in after} == before == {encode(e) for e in events}
    assert sorted(r.key for r in after) == sorted(e.group_id.encode() for e in events)


def _produce_timed(bootstrap: str, topic: str) -> list[Any]:
    """12 trajectories of 4 groups (3 samples each) on 2 partitions, each with a trace context
    and its content headers, at event times an hour ago spread over minutes (out of partition
    order): what a replay orders and times its groups by."""
    codec = Codec()
    producer = Producer({"bootstrap.servers": bootstrap})
    start_ms = int(time.time() * 1000) - 3_600_000
    sent = []
    for i in range(12):
        event = make_trajectory(f"g{i % 4}", i // 4, reward=i / 10)
        value = encode(event)
        trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        headers = [("traceparent", f"00-{trace_id}-{span_id}-01".encode()), *codec.content_headers(value)]
        at = start_ms + (i * 37_000) % 200_000  # not in offset order
        producer.produce(topic, key=event.group_id.encode(), value=value, headers=headers,
                         timestamp=at, partition=i % 2)  # fmt: skip
        sent.append(event)
    assert producer.flush(30) == 0
    return sent


def _stored(bootstrap: str, topic: str) -> list[tuple[Any, ...]]:
    return sorted(
        (r.partition, r.timestamp_ms, r.key, r.value, r.headers)
        for r in read_range(bootstrap, ReplayRange(topic=topic))
    )


def _batches(bootstrap: str, topic: str) -> list[tuple[str, bytes]]:
    config = build(
        ReplayAssembler.Config, {"grouping": {"group_size": 3}, "mixture": {"batch_size": 1}}, where="test"
    )
    return ReplayAssembler(config, Codec()).assemble(read_range(bootstrap, ReplayRange(topic=topic))).batches


def test_import_keeps_headers_timestamps_and_partitions_so_a_replay_matches_the_source(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    source, target = fresh_topic("export-src", partitions=2), fresh_topic("import-dst", partitions=2)
    _produce_timed(kafka_bootstrap, source)
    dest = tmp_path / "traj.parquet"
    exported = _stacx("export", source, str(dest), "--bootstrap", kafka_bootstrap)
    assert exported.returncode == 0, exported.stderr
    imported = _stacx("import", str(dest), target, "--bootstrap", kafka_bootstrap)
    assert imported.returncode == 0, imported.stderr

    assert _stored(kafka_bootstrap, target) == _stored(kafka_bootstrap, source)
    # batch ids follow the order groups complete in (event time); batch bytes carry that time
    assert _batches(kafka_bootstrap, target) == _batches(kafka_bootstrap, source)


def test_export_leaves_out_an_undecodable_record_and_says_where(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path
) -> None:
    source = fresh_topic("export-bad", partitions=1)
    events = [make_trajectory("g0", i) for i in range(3)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in (encode(events[0]), b"\xc3\x01 not an event", encode(events[1]), encode(events[2])):
        producer.produce(source, key=b"g0", value=value)
    assert producer.flush(30) == 0
    dest = tmp_path / "traj.parquet"

    exported = _stacx("export", source, str(dest), "--bootstrap", kafka_bootstrap)
    assert exported.returncode == 0, exported.stderr
    assert "Traceback" not in exported.stderr
    (line,) = [x for x in exported.stderr.splitlines() if x.startswith("stacx export:")]
    assert line.startswith(
        f"stacx export: left out 1 undecodable record(s) of {source} (the first at partition 0 offset 1"
    )
    assert "exported 3 trajectories" in exported.stdout
    assert list(pd.read_parquet(dest)["trajectory_id"]) == [e.trajectory_id for e in events]
