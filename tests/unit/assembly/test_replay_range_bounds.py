"""`read_range` reads exactly the asked range: offsets and timestamps resolved per partition,
compaction gaps and transaction markers, a broker that stops short, bounded broker calls
(a stand-in for the Kafka consumer that answers like librdkafka)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest

from stacx.consumers.errors import ConsumerError
from stacx.consumers.replay import ReplayRange, read_range

OFFSET_INVALID = -1001
"""What librdkafka answers for a position or cached watermark it does not know yet."""


class _Message:
    def __init__(self, partition: int, offset: int, timestamp_ms: int, *, error: object = None) -> None:
        self._p, self._o, self._t, self._error = partition, offset, timestamp_ms, error

    def error(self) -> object:
        return self._error

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return (1, self._t)

    def headers(self) -> list[tuple[str, bytes]]:
        return [("traceparent", f"tp-{self._p}-{self._o}".encode())]

    def key(self) -> bytes:
        return f"k{self._p}".encode()

    def value(self) -> bytes:
        return f"{self._p}:{self._o}".encode()


class _Broker:
    """One topic `t`. `logs`: partition -> [(offset, timestamp_ms)] (gaps: compacted records);
    `high`: partition -> high watermark (above the last record: a transaction marker).
    `withheld`: partitions whose records never arrive (a broker that stops short)."""

    def __init__(
        self,
        logs: dict[int, list[tuple[int, int]]],
        high: dict[int, int] | None = None,
        withheld: set[int] = frozenset(),  # type: ignore[assignment]
        error_first: bool = False,
    ) -> None:
        self.logs, self.withheld, self.error_first = logs, withheld, error_first
        self.high = {p: (log[-1][0] + 1 if log else 0) for p, log in logs.items()} | (high or {})
        self.configs: list[dict[str, Any]] = []
        self.timeouts: list[tuple[str, object]] = []
        self.assigned: list[tuple[str, int, int]] = []
        self.consume_args: list[tuple[object, object]] = []

    def consumer(self, config: dict[str, Any]) -> _Consumer:
        self.configs.append(dict(config))
        return _Consumer(self)


class _Consumer:
    def __init__(self, broker: _Broker) -> None:
        self.b = broker
        self._batches: list[list[_Message]] = []
        self._positions: dict[int, int] = {}

    def list_topics(self, timeout: float) -> Any:
        self.b.timeouts.append(("list_topics", timeout))
        meta = SimpleNamespace(error=None, partitions=dict.fromkeys(self.b.logs))
        return SimpleNamespace(topics={"t": meta})

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.b.timeouts.append(("get_watermark_offsets", timeout))
        if cached:  # the local cache: nothing fetched yet
            return OFFSET_INVALID, OFFSET_INVALID
        log = self.b.logs[tp.partition]
        return (log[0][0] if log else 0), self.b.high[tp.partition]

    def offsets_for_times(self, tps: list[Any], timeout: float) -> list[Any]:
        self.b.timeouts.append(("offsets_for_times", timeout))
        out = []
        for tp in tps:
            assert tp.topic == "t"
            found = [o for o, ts in self.b.logs[tp.partition] if ts >= tp.offset]
            out.append(SimpleNamespace(partition=tp.partition, offset=found[0] if found else -1))
        return out

    def assign(self, tps: list[Any]) -> None:
        self.b.assigned = [(tp.topic, tp.partition, tp.offset) for tp in tps]
        self._batches = [[]]  # the first fetch comes back empty
        for tp in tps:
            if tp.partition in self.b.withheld:
                continue
            batch = [_Message(tp.partition, o, ts) for o, ts in self.b.logs[tp.partition] if o >= tp.offset]
            if self.b.error_first:
                batch.insert(0, _Message(tp.partition, -1, 0, error="_PARTITION_EOF"))
            self._batches.append(batch)

    def consume(self, num: int, timeout: float) -> list[_Message]:
        self.b.consume_args.append((num, timeout))
        batch = self._batches.pop(0) if self._batches else []
        for m in batch:
            if m.error() is None:  # the position moves past the log end (markers included)
                self._positions[m.partition()] = self.b.high[m.partition()]
        return batch

    def position(self, tps: list[Any]) -> list[Any]:
        return [
            SimpleNamespace(partition=tp.partition, offset=self._positions.get(tp.partition, OFFSET_INVALID))
            for tp in tps
        ]

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        pass


def _read(monkeypatch: pytest.MonkeyPatch, broker: _Broker, spec: ReplayRange, **kw: Any) -> list[Any]:
    monkeypatch.setattr(confluent_kafka, "Consumer", broker.consumer)
    return read_range("127.0.0.1:1", spec, **kw)


# partition -> [(offset, timestamp_ms)]; partition 1 was compacted (offsets 0 and 1 gone)
LOGS = {0: [(0, 100), (1, 200), (2, 300), (3, 400)], 1: [(2, 150), (3, 250), (5, 350)]}


def test_a_timestamp_range_is_resolved_per_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS)
    records = _read(monkeypatch, broker, ReplayRange(topic="t", from_timestamp_ms=200, to_timestamp_ms=350))
    assert [(r.partition, r.offset) for r in records] == [(0, 1), (1, 3), (0, 2)]
    # each partition is fetched from its own first offset at or after the start time
    assert sorted(broker.assigned) == [("t", 0, 1), ("t", 1, 3)]


def test_a_start_before_every_record_reads_from_the_first_one(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS)
    records = _read(monkeypatch, broker, ReplayRange(topic="t", from_timestamp_ms=0))
    got = [(r.partition, r.offset) for r in records]
    assert got == [(0, 0), (1, 2), (0, 1), (1, 3), (0, 2), (1, 5), (0, 3)]


def test_an_end_after_every_record_reads_to_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS)
    records = _read(monkeypatch, broker, ReplayRange(topic="t", from_offset=3, to_timestamp_ms=10_000))
    assert [(r.partition, r.offset) for r in records] == [(1, 3), (1, 5), (0, 3)]


def test_the_range_ends_at_the_watermark_the_replay_started_with(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS)
    records = _read(monkeypatch, broker, ReplayRange(topic="t"))
    assert len(records) == 7  # the broker's watermarks, not the consumer's empty cache
    assert records[0].headers == (("traceparent", b"tp-0-0"),) and records[0].key == b"k0"


def test_an_empty_partition_range_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker({0: [(0, 100), (1, 200)], 1: [(4, 100)]})
    records = _read(monkeypatch, broker, ReplayRange(topic="t", from_offset=5), timeout_s=0.3)
    assert records == [] and broker.assigned == []


def test_a_transaction_marker_at_the_end_closes_the_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker({0: [(0, 100), (1, 200)], 1: [(0, 150)]}, high={0: 3})
    records = _read(monkeypatch, broker, ReplayRange(topic="t"), timeout_s=0.3)
    assert [(r.partition, r.offset) for r in records] == [(0, 0), (1, 0), (0, 1)]


def test_errors_in_a_fetch_are_skipped_not_the_records_after_them(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS, error_first=True)
    records = _read(monkeypatch, broker, ReplayRange(topic="t", to_offset=3))
    assert [(r.partition, r.offset) for r in records] == [(0, 0), (1, 2), (0, 1), (0, 2)]


def test_a_broker_that_stops_short_fails_with_the_partitions_named(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS, withheld={1})
    with pytest.raises(ConsumerError, match=r"replay: t stopped short of the range end at partitions \[1\]"):
        _read(monkeypatch, broker, ReplayRange(topic="t"), timeout_s=0.3)


def test_every_broker_call_is_bounded_and_nothing_is_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS)
    spec = ReplayRange(topic="t", from_timestamp_ms=200, to_timestamp_ms=350)
    _read(monkeypatch, broker, spec, timeout_s=7.0)
    calls = {name for name, _ in broker.timeouts}
    assert calls == {"list_topics", "get_watermark_offsets", "offsets_for_times"}
    assert all(timeout == 7.0 for _, timeout in broker.timeouts)
    (config,) = broker.configs
    assert config["bootstrap.servers"] == "127.0.0.1:1"
    assert config["enable.auto.commit"] is False  # a replay never moves a group's offsets
    assert config["group.id"] == "stacx-replay-reader"
    assert all(isinstance(num, int) and num > 0 and 0 < timeout <= 1 for num, timeout in broker.consume_args)


@pytest.mark.parametrize(
    "meta",
    [
        None,
        SimpleNamespace(error="UNKNOWN_TOPIC", partitions={0: None}),
        SimpleNamespace(error=None, partitions={}),
    ],
)
def test_a_missing_topic_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, meta: object) -> None:
    broker = _Broker(LOGS)
    topics = {} if meta is None else {"t": meta}
    monkeypatch.setattr(_Consumer, "list_topics", lambda self, timeout: SimpleNamespace(topics=topics))
    with pytest.raises(ConsumerError, match=r"replay: topic 't' does not exist at 127.0.0.1:1"):
        _read(monkeypatch, broker, ReplayRange(topic="t"))


def test_an_end_inside_a_compaction_gap_reads_nothing_past_it(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker(LOGS)
    records = _read(monkeypatch, broker, ReplayRange(topic="t", from_offset=2, to_offset=5))
    assert [(r.partition, r.offset) for r in records] == [(1, 2), (1, 3), (0, 2), (0, 3)]
