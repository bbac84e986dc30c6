"""Trajectories -> Arrow/Parquet -> trajectories keeps every field; pandas reads the file."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from stacx.consumers.assembly.testing import make_trajectory
from stacx.consumers.parquet import records_from_table, table_from_records
from stacx.consumers.replay import RangeRecord
from stacx.schemas.codec import encode
from stacx.schemas.records import ToolCall, TrajectoryStatus, Turn, token_ids


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


HEADERS = (
    ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ("content-type", b"avro"),
)


def _write(tmp_path: Path) -> tuple[Path, list]:
    events = _rich()
    sources = [
        RangeRecord(p, 10 + p, 1_000 + p, e.group_id.encode(), encode(e), HEADERS)
        for p, e in enumerate(events)
    ]
    table = table_from_records(zip(sources, events, strict=True))
    pq.write_table(table, tmp_path / "t.parquet")
    return tmp_path / "t.parquet", events


def test_every_field_survives_the_table(tmp_path: Path) -> None:
    path, events = _write(tmp_path)
    back = records_from_table(pq.read_table(path))
    assert [encode(e) for _, e in back] == [encode(e) for e in events]
    assert [k for k, _ in back] == [b"g0", b"g0"]
    from stacx.consumers.parquet import import_rows

    rows = import_rows(pq.read_table(path))
    assert [(r.partition, r.timestamp_ms) for r in rows] == [(0, 1_000), (1, 1_001)]
    assert all(r.headers == list(HEADERS) for r in rows)

    import pandas as pd

    frame = pd.read_parquet(tmp_path / "t.parquet")
    assert list(frame["kafka_offset"]) == [10, 11] and list(frame["reward"]) == [0.0, 0.25]
    assert list(frame["token_ids"][1]) == list(events[1].token_ids)


def test_hugging_face_datasets_reads_the_file(tmp_path: Path) -> None:
    import datasets

    path, events = _write(tmp_path)
    loaded = datasets.load_dataset(
        "parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    assert loaded.num_rows == 2 and loaded["trajectory_id"] == [e.trajectory_id for e in events]
    rich = loaded[1]
    assert {p["key"]: p["value"] for p in rich["rewards"]} == {"exact": 1.0, "format": 0.5}
    assert [p["key"] for p in rich["metadata"]] == ["z", "scaffold"]  # insertion order kept
    assert rich["token_ids"] == [int(t) for t in events[1].token_ids]
    assert rich["turns"][0]["tool_calls"][0]["name"] == "python"
    assert rich["kafka_headers"] == [{"key": k, "value": v} for k, v in HEADERS]


def test_files_written_with_arrow_maps_still_import(tmp_path: Path) -> None:
    """Files from before mappings were struct lists: maps, no headers column."""
    import pyarrow as pa

    from stacx.consumers.parquet import import_rows

    path, events = _write(tmp_path)
    current = pq.read_table(path).drop_columns(["rewards", "metadata", "kafka_headers"])
    as_map = pa.map_(pa.string(), pa.float64())
    table = current.append_column("rewards", pa.array([list(e.rewards.items()) for e in events], as_map))
    as_map = pa.map_(pa.string(), pa.string())
    table = table.append_column("metadata", pa.array([list(e.metadata.items()) for e in events], as_map))
    back = import_rows(table)
    assert [encode(r.event) for r in back] == [encode(e) for e in events] and back[0].headers == []
