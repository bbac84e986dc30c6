"""`stacx export` then `stacx import` on the real broker: every field of every event survives,
and pandas reads the exported file."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from confluent_kafka import Producer

from consumers.assembly.testing import make_trajectory
from consumers.replay import ReplayRange, read_range
from schemas.codec import encode
from schemas.records import ToolCall, TrajectoryStatus, Turn, token_ids

REPO = Path(__file__).resolve().parents[3]


def _stacx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=180
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
