"""Replay: assemble a retained range of a trajectories topic into training batches, the same
bytes every time.

The live assembler (Faust) is driven by arrival order across partitions and by wall-clock
ticks, so two passes over one topic can group and batch differently. A replay reads a bounded
range (per-partition offsets, or timestamps resolved with `offsets_for_times`) to its end,
orders it by (timestamp, partition, offset), and runs the assembler's own stages —
`GroupAssembler`, `BatchBuilder`, `BatchEncoder` — in memory with the records' timestamps as
the clock. Same range and settings: same batch ids, same batch bytes. Groups still open at the
end of the range close as timed out (then follow the partial-group policy); groups the mixture
could not fit in a whole batch are left out (`ReplayResult.stats`). Each batch comes with the
headers the live assembler gives it: its content type and schema fingerprint, and (tracing on)
the context of an `assembler.batch` span that continues its first trajectory's trace and links
to every other trajectory's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stacx.consumers.assembly.batching import BatchBuilder
from stacx.consumers.assembly.claims import BatchEncoder, decode_trajectory
from stacx.consumers.assembly.envelope import ReadyGroup, encode_group
from stacx.consumers.assembly.filters import SampleFilter, invalid_reason
from stacx.consumers.assembly.grouping import GroupAssembler
from stacx.consumers.assembly.mixture import MixturePlanner
from stacx.consumers.assembly.stats import AssemblyStats
from stacx.consumers.assembly.tracing import TraceLinks
from stacx.consumers.errors import ConsumerError
from stacx.producers.kafka_log import kafka_logger
from stacx.schemas import topics
from stacx.schemas.codec import Codec

__all__ = ["RangeRecord", "ReplayAssembler", "ReplayRange", "ReplayResult", "read_range"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RangeRecord:
    """One retained record of the replayed range."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...] = ()
    """The record's Kafka headers (trace context, content type), in order."""


@dataclass(kw_only=True, slots=True)
class ReplayRange:
    """Which part of a topic to replay: [start, end) by offset or by time (epoch ms).

    Offsets apply to every partition; a timestamp is resolved per partition with
    `offsets_for_times` (the first record at or after it). Unset: from the first retained record /
    to the end the topic had when the replay started."""

    topic: str
    """The retained trajectories topic."""
    from_offset: int | None = None
    to_offset: int | None = None
    from_timestamp_ms: int | None = None
    to_timestamp_ms: int | None = None

    def __post_init__(self) -> None:
        if self.from_offset is not None and self.from_timestamp_ms is not None:
            raise ValueError("replay range: set from_offset or from_timestamp_ms, not both")
        if self.to_offset is not None and self.to_timestamp_ms is not None:
            raise ValueError("replay range: set to_offset or to_timestamp_ms, not both")
        for name in ("from_offset", "to_offset", "from_timestamp_ms", "to_timestamp_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"replay range: {name}={value} must be >= 0")


def read_range(bootstrap_servers: str, spec: ReplayRange, *, timeout_s: float = 30.0) -> list[RangeRecord]:
    """Every record of `spec`'s range, in (timestamp, partition, offset) order."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "stacx-replay-reader",
            "logger": kafka_logger(),
            "enable.auto.commit": False,
        }
    )
    try:
        # all topics: asking for one by name would auto-create it on brokers that allow that
        meta = consumer.list_topics(timeout=timeout_s).topics.get(spec.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ConsumerError(f"replay: topic {spec.topic!r} does not exist at {bootstrap_servers}")
        bounds = _bounds(consumer, spec, sorted(meta.partitions), timeout_s)
        records = _read_all(consumer, spec.topic, bounds, timeout_s)
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.timestamp_ms, r.partition, r.offset))


def _bounds(
    consumer: Any, spec: ReplayRange, partitions: list[int], timeout_s: float
) -> dict[int, tuple[int, int]]:
    from confluent_kafka import TopicPartition

    out: dict[int, tuple[int, int]] = {}
    for p in partitions:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(spec.topic, p), timeout=timeout_s, cached=False
        )
        start, end = low, high
        if spec.from_offset is not None:
            start = max(low, spec.from_offset)
        elif spec.from_timestamp_ms is not None:
            start = max(low, _at(consumer, spec.topic, p, spec.from_timestamp_ms, high, timeout_s))
        if spec.to_offset is not None:
            end = min(high, spec.to_offset)
        elif spec.to_timestamp_ms is not None:
            end = _at(consumer, spec.topic, p, spec.to_timestamp_ms, high, timeout_s)
        out[p] = (start, end)
    return out


def _at(
    consumer: Any, topic: str, partition: int, timestamp_ms: int | None, high: int, timeout_s: float
) -> int:
    """The first offset at or after `timestamp_ms` (`high` when none is)."""
    from confluent_kafka import TopicPartition

    if timestamp_ms is None:
        return high
    (found,) = consumer.offsets_for_times([TopicPartition(topic, partition, timestamp_ms)], timeout=timeout_s)
    return found.offset if found.offset >= 0 else high


def _read_all(
    consumer: Any, topic: str, bounds: dict[int, tuple[int, int]], timeout_s: float
) -> list[RangeRecord]:
    """Every record in `bounds` (partition -> [start, end)), all partitions fetched at once."""
    import time

    from confluent_kafka import TopicPartition

    todo = {p: start for p, (start, end) in bounds.items() if start < end}
    consumer.assign([TopicPartition(topic, p, start) for p, start in todo.items()])
    out: list[RangeRecord] = []
    deadline = time.monotonic() + timeout_s
    while todo:
        messages = consumer.consume(10_000, 0.1)
        if messages:
            deadline = time.monotonic() + timeout_s
        elif time.monotonic() > deadline:
            raise ConsumerError(
                f"replay: {topic} stopped short of the range end at partitions {sorted(todo)}"
            )
        for msg in messages:
            p = msg.partition()
            if msg.error() is not None or p not in todo or msg.offset() >= bounds[p][1]:
                continue
            headers = tuple(msg.headers() or ())
            out.append(RangeRecord(p, msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), headers))
            if msg.offset() + 1 >= bounds[p][1]:
                del todo[p]
        # compaction and transaction markers leave offset gaps: the position says where a partition is
        for tp in consumer.position([TopicPartition(topic, p) for p in todo]) if todo else []:
            if tp.offset >= bounds[tp.partition][1]:
                del todo[tp.partition]
    consumer.unassign()
    return out


@dataclass(kw_only=True, slots=True)
class ReplayResult:
    """Batches of one replay, in order, with the assembler's counters."""

    batches: list[tuple[str, bytes]] = field(default_factory=list)
    """(batch id, encoded value) as published to the batches topic."""
    headers: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)
    """Kafka headers of each batch, by batch id: content type, schema, trace context."""
    stats: dict[str, Any] = field(default_factory=dict)
    undecodable: int = 0
    """Records left out because they do not decode or are not valid trajectories."""
    max_token_id: int = -1
    """Largest token id of the valid trajectories (-1: none): the model's vocabulary must hold it."""


class ReplayAssembler:
    """The assembler's stages in memory, on record time: a deterministic function of the range."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        grouping: GroupAssembler.Config = field(default_factory=GroupAssembler.Config)
        """Grouping and partial-group policy (as the live assembler's)."""
        filtering: SampleFilter.Config = field(default_factory=SampleFilter.Config)
        """Failure policy; staleness counts against `latest_versions` (none: nothing is stale)."""
        mixture: MixturePlanner.Config = field(default_factory=MixturePlanner.Config)
        """Batch size and task mixture."""
        batching: BatchBuilder.Config = field(default_factory=BatchBuilder.Config)
        """Packing-stage state retention."""
        output: BatchEncoder.Config = field(default_factory=BatchEncoder.Config)
        """Claim check for batches too large for the batches topic."""

    def __init__(
        self,
        config: Config,
        codec: Codec,
        *,
        batches_topic: str = topics.BATCHES,
        latest_versions: dict[str, int] | None = None,
    ) -> None:
        self.config = config
        self.codec = codec
        self.stats = AssemblyStats()
        tables: dict[str, dict[str, Any]] = {
            n: {} for n in ("groups", "payloads", "clocks", "pool", "index", "packed")
        }
        sample_filter = SampleFilter(config.filtering, latest_versions or {})
        self._grouper = GroupAssembler(
            config.grouping, sample_filter=sample_filter, groups=tables["groups"],
            payloads=tables["payloads"], stats=self.stats, clocks=tables["clocks"],
        )  # fmt: skip
        self._builder = BatchBuilder(
            config.batching, planner=MixturePlanner(config.mixture), sample_filter=sample_filter,
            pool=tables["pool"], index=tables["index"], packed=tables["packed"], stats=self.stats,
            codec=codec,
        )  # fmt: skip
        self._encoder = BatchEncoder(config.output, codec, topic=batches_topic)
        self._links = TraceLinks()

    def assemble(self, records: Iterable[RangeRecord]) -> ReplayResult:
        """Batches from `records` (in the order given), then from the groups open at the end."""
        result = ReplayResult()
        last_ms = 0
        for record in records:
            last_ms = max(last_ms, record.timestamp_ms)
            self._on_record(record, result)
        self._close_open_groups(last_ms, result)
        result.stats = self.stats.as_dict()
        return result

    def _on_record(self, record: RangeRecord, result: ReplayResult) -> None:
        self.stats.trajectories += 1
        try:
            trajectory = decode_trajectory(record.value, self.codec)
        except Exception as exc:  # untrusted bytes: left out, as the live assembler dead-letters them
            log.warning(
                "replay: undecodable record at partition %d offset %d: %s",
                record.partition,
                record.offset,
                exc,
            )
            self._left_out(result)
            return
        if invalid_reason(trajectory) is not None:
            self._left_out(result)
            return
        self._links.remember(trajectory.group_id, trajectory.trajectory_id, record.headers)
        if len(trajectory.token_ids):
            result.max_token_id = max(result.max_token_id, int(trajectory.token_ids.max()))
        ready = self._grouper.on_trajectory(
            trajectory, record.value, partition=record.partition, now_ms=record.timestamp_ms
        )
        if ready is not None:
            self._emit(ready, record.timestamp_ms, result)

    def _left_out(self, result: ReplayResult) -> None:
        """A record that is no trajectory to train on: counted where the live assembler counts
        the events it dead-letters."""
        result.undecodable += 1
        self.stats.undecodable += 1

    def _close_open_groups(self, last_ms: int, result: ReplayResult) -> None:
        """Advance every partition's clock past the group timeout: open groups close as timed out."""
        step_ms = int(self._grouper.config.max_clock_step_s * 1000)
        steps = int(self._grouper.config.group_timeout_s * 1000 // step_ms) + 2
        for i in range(1, steps + 1):
            now = last_ms + i * step_ms
            for ready in self._grouper.expire(now_ms=now):
                self._emit(ready, now, result)

    def _emit(self, ready: ReadyGroup, now_ms: int, result: ReplayResult) -> None:
        self._links.take_group(self._links.group_headers(ready.group_id))
        for batch in self._builder.on_group(encode_group(ready), now_ms=now_ms):
            batch = dataclasses.replace(batch, created_at_ms=now_ms)  # record time, not wall time
            with self._links.batch_span(batch.batch_id, batch.trajectory_ids) as trace_headers:
                value = self._encoder.encode(batch)
            result.batches.append((batch.batch_id, value))
            result.headers[batch.batch_id] = [*(trace_headers or []), *self.codec.content_headers(value)]
            self.stats.batch_sent(batch)
