"""`read_range` returns a range in (timestamp, partition, offset) order, however the broker
delivers it (a recording stand-in for the Kafka consumer: partitions arrive one after another)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest

from stacx.consumers.replay import ReplayRange, read_range

# partition -> [(offset, timestamp_ms)]
LOG = {0: [(0, 30), (1, 10), (2, 50)], 1: [(0, 20), (1, 10), (2, 40)]}


class _Message:
    def __init__(self, partition: int, offset: int, timestamp_ms: int) -> None:
        self._p, self._o, self._t = partition, offset, timestamp_ms

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return (1, self._t)

    def headers(self) -> None:
        return None

    def key(self) -> bytes:
        return f"k{self._p}".encode()

    def value(self) -> bytes:
        return f"{self._p}:{self._o}".encode()


class _Consumer:
    """Delivers partition 1 first, then partition 0, each in offset order."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._batches: list[list[_Message]] = []
        self._positions: dict[int, int] = {}

    def list_topics(self, timeout: float) -> Any:
        meta = SimpleNamespace(error=None, partitions={0: None, 1: None})
        return SimpleNamespace(topics={"t": meta})

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, len(LOG[tp.partition])

    def assign(self, tps: list[Any]) -> None:
        self._batches = [
            [_Message(tp.partition, o, t) for o, t in LOG[tp.partition] if o >= tp.offset]
            for tp in sorted(tps, key=lambda tp: -tp.partition)
        ]

    def consume(self, num: int, timeout: float) -> list[_Message]:
        batch = self._batches.pop(0) if self._batches else []
        for m in batch:
            self._positions[m.partition()] = m.offset() + 1
        return batch

    def position(self, tps: list[Any]) -> list[Any]:
        return [
            SimpleNamespace(partition=tp.partition, offset=self._positions.get(tp.partition, 0)) for tp in tps
        ]

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_records_come_back_in_timestamp_partition_offset_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confluent_kafka, "Consumer", _Consumer)
    records = read_range("127.0.0.1:1", ReplayRange(topic="t"))
    assert [(r.timestamp_ms, r.partition, r.offset) for r in records] == [
        (10, 0, 1),
        (10, 1, 1),
        (20, 1, 0),
        (30, 0, 0),
        (40, 1, 2),
        (50, 0, 2),
    ]
    assert records[0].value == b"0:1" and records[0].key == b"k0"


def test_an_offset_range_applies_to_every_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confluent_kafka, "Consumer", _Consumer)
    records = read_range("127.0.0.1:1", ReplayRange(topic="t", from_offset=1, to_offset=2))
    assert [(r.partition, r.offset) for r in records] == [(0, 1), (1, 1)]


class _RecordingConsumer(_Consumer):
    """`_Consumer` that keeps the timeouts and cache choice of each question, answers timestamp
    look-ups, goes quiet for one poll between partitions and reports no position at all (as after
    transaction markers the broker has not yet skipped)."""

    asked: list[tuple[str, object]] = []

    def list_topics(self, timeout: float) -> Any:
        self.asked.append(("list_topics", timeout))
        return super().list_topics(timeout)

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.asked.append(("watermarks", (timeout, cached)))
        return super().get_watermark_offsets(tp, timeout, cached)

    def offsets_for_times(self, tps: list[Any], timeout: float) -> list[Any]:
        (tp,) = tps
        found = [o for o, t in LOG[tp.partition] if t >= tp.offset]
        return [SimpleNamespace(offset=found[0] if found else -1)]

    def assign(self, tps: list[Any]) -> None:
        super().assign(tps)
        quiet: list[_Message] = []
        self._batches = [b for batch in self._batches for b in (batch, quiet)]

    def position(self, tps: list[Any]) -> list[Any]:
        return [SimpleNamespace(partition=tp.partition, offset=0) for tp in tps]


def test_a_range_asks_fresh_watermarks_within_the_timeout_and_waits_out_quiet_polls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(confluent_kafka, "Consumer", _RecordingConsumer)
    monkeypatch.setattr(_RecordingConsumer, "asked", [])
    records = read_range("127.0.0.1:1", ReplayRange(topic="t"), timeout_s=5.0)
    # every record, though a poll came back empty between partitions and positions lag behind
    assert sorted((r.partition, r.offset) for r in records) == [(p, o) for p in (0, 1) for o in range(3)]
    fresh = ("watermarks", (5.0, False))  # the broker's current end of each partition, not a cached one
    assert _RecordingConsumer.asked == [("list_topics", 5.0), fresh, fresh]
    monkeypatch.setattr(_RecordingConsumer, "asked", [])
    read_range("127.0.0.1:1", ReplayRange(topic="t"))
    assert _RecordingConsumer.asked[0] == ("list_topics", 30.0)  # the default timeout


def test_a_range_starting_after_every_record_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confluent_kafka, "Consumer", _RecordingConsumer)
    assert read_range("127.0.0.1:1", ReplayRange(topic="t", from_timestamp_ms=60), timeout_s=1.0) == []
    records = read_range("127.0.0.1:1", ReplayRange(topic="t", from_timestamp_ms=40), timeout_s=1.0)
    assert [(r.partition, r.offset) for r in records] == [(1, 2), (0, 2)]
