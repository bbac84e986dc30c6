"""Trajectories -> Arrow/Parquet -> trajectories keeps every field; pandas reads the file."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from consumers.assembly.testing import make_trajectory
from consumers.parquet import records_from_table, table_from_records
from consumers.replay import RangeRecord
from schemas.codec import encode
from schemas.records import ToolCall, TrajectoryStatus, Turn, token_ids


def _rich() -> list:
    plain = make_trajectory("g0", 0)
    rich = make_trajectory("g0", 1, status=TrajectoryStatus.FAILED, reward=0.25)
    rich.turns = [
        Turn(role="assistant", text="call", token_ids=token_ids([5, 6]), policy_version=3,
             tool_calls=[ToolCall(id="c1", name="python", arguments='{"code": "1+1"}')]),
        Turn(role="tool", text="2", observation="2", started_at_ms=7, duration_ms=9),
    ]  # fmt: skip
    rich.rewards = {"exact": 1.0, "format": 0.5}
    rich.metadata = {"z": "last", "scaffold": "retool"}  # not sorted: order is kept
    rich.error = "sandbox timed out"
    return [plain, rich]


def test_every_field_survives_the_table(tmp_path: Path) -> None:
    events = _rich()
    sources = [
        RangeRecord(p, 10 + p, 1_000 + p, e.group_id.encode(), encode(e)) for p, e in enumerate(events)
    ]
    table = table_from_records(zip(sources, events, strict=True))
    pq.write_table(table, tmp_path / "t.parquet")
    back = records_from_table(pq.read_table(tmp_path / "t.parquet"))
    assert [encode(e) for _, e in back] == [encode(e) for e in events]
    assert [k for k, _ in back] == [b"g0", b"g0"]

    import pandas as pd

    frame = pd.read_parquet(tmp_path / "t.parquet")
    assert list(frame["kafka_offset"]) == [10, 11] and list(frame["reward"]) == [0.0, 0.25]
    assert list(frame["token_ids"][1]) == list(events[1].token_ids)
