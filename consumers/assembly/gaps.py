"""Every input event reaches the agents once, in offset order, even when Faust drops one.

The assembler holds acknowledgements while a group is open (`holding`), so an event that never
reaches its agent is not merely late: once a later event of its partition is acknowledged, Faust
commits past it and it is lost. Faust can drop such an event around a rebalance: its recovery
resumes the partitions, seeks them to their committed offsets, and only then resumes the flow,
which empties the agents' queues (on a first assignment) or skips what is fetched meanwhile (on a
later one). An event fetched right after the seek falls in between: its read offset is already
past it, so it is never fetched again. Seen as a restarted worker missing the event at its
committed offset, about one restart in five on a loaded machine.

`OffsetGuard` knows, per partition, the next offset an agent must see: the committed offset when
the partition is assigned, then one past each event taken. An event past it means events were
dropped: `KafkaGapReader` reads them straight from Kafka, and the agent processes them first. An
event before it is a second delivery of one already taken (Faust re-reads from the committed
offset after a seek): it is skipped. Offsets with no record (transaction markers) are simply
not found by the reader. When the dropped events are the last ones, no later event reveals
them: a partition that saw nothing for a while (`quiet_s`) is compared with its high watermark,
and what is missing is read the same way (`InputOrder.stalled`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import faust
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from faust.types import TP

from stacx.consumers.assembly.errors import AssemblyError, BrokerUnavailableError
from stacx.producers.kafka_log import kafka_logger

__all__ = [
    "GapReader",
    "InputOrder",
    "KafkaGapReader",
    "OffsetGuard",
    "Refetched",
    "ack",
    "is_transient",
    "kafka_failure",
]

log = logging.getLogger(__name__)

TRANSIENT_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        # librdkafka's own: a broker connection torn down (SIGKILL, link down), a name not
        # resolving yet, a request or queue timing out while the cluster moves leaders
        KafkaError._DESTROY_BROKER,
        KafkaError._RESOLVE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._NODE_UPDATE,
        KafkaError._WAIT_CACHE,
        KafkaError._RETRY,
    }
)
"""Errors of a cluster that is settling (a broker restart, a leader moving), not of the request."""


def is_transient(error: KafkaError) -> bool:
    """Whether the same request succeeds once the cluster settles (never for a fatal error)."""
    return not error.fatal() and (error.retriable() or error.code() in TRANSIENT_CODES)


def kafka_failure(what: str, error: KafkaError) -> AssemblyError:
    """`AssemblyError` for a Kafka error: retriable (`BrokerUnavailableError`) when transient."""
    if is_transient(error):
        return BrokerUnavailableError(f"{what}: {error}")
    return AssemblyError(f"{what}: {error}")


class GapReader(Protocol):
    """Where a partition's reading starts, and the records Faust did not deliver (Kafka in the
    worker, a dict in unit tests). Blocking: the agents call it in a thread."""

    def start_offset(self, topic: str, partition: int) -> int:
        """The offset the consumer group reads `topic[partition]` from after an assignment."""
        ...

    def end_offset(self, topic: str, partition: int) -> int:
        """The high watermark of `topic[partition]` (one past its last record)."""
        ...

    def read(self, topic: str, partition: int, offsets: range) -> list[Any]:
        """The records at `offsets` that exist (confluent-kafka `Message`s: `.offset()`,
        `.value()`...), in order."""
        ...

    def records_since(self, topic: str, timestamp_ms: int) -> list[Any]:
        """Every record of `topic` (all its partitions) written at or after `timestamp_ms`."""
        ...

    def close(self) -> None: ...


class OffsetGuard:
    """The next offset each partition's agent must see, and since when it saw nothing."""

    def __init__(self) -> None:
        self._next: dict[Hashable, int] = {}
        self._quiet_from: dict[Hashable, float] = {}

    def assigned(self, sources: set[Any], now: float) -> None:
        """`sources` (topic partitions) were assigned: quiet from `now` until an event arrives."""
        for source in sources:
            self._quiet_from[source] = now

    def knows(self, source: Hashable) -> bool:
        """Whether `source` has a starting offset since it was assigned."""
        return source in self._next

    def start(self, source: Hashable, offset: int, now: float) -> None:
        """`source` reads from `offset` (its committed offset)."""
        self._next[source] = offset
        self._quiet_from.setdefault(source, now)

    def admit(self, source: Hashable, offset: int, now: float) -> range | None:
        """An event of `source` at `offset` arrived. None: it was taken before (skip it);
        otherwise the offsets that should have come first (empty when none did not) — the event
        is taken."""
        expected = self._next.get(source, offset)
        if offset < expected:
            return None
        self._next[source] = offset + 1
        self._quiet_from[source] = now
        return range(expected, offset)

    def stalled(self, source: Hashable, end: int, now: float, quiet_s: float) -> range | None:
        """Offsets of `source` below `end` (its high watermark) that have not arrived although
        nothing arrived for `quiet_s`: the tail Faust dropped, with no later event to reveal it.
        None when nothing is missing, `source` has no start yet, or it was not quiet for long."""
        expected = self._next.get(source)
        quiet_from = self._quiet_from.get(source, now)
        if expected is None or end <= expected or now - quiet_from < quiet_s:
            return None
        return range(expected, end)

    def quiet(self, source: Hashable, now: float, quiet_s: float) -> bool:
        """Whether `source` is assigned and saw no event for `quiet_s`."""
        return source in self._quiet_from and now - self._quiet_from[source] >= quiet_s

    def next_offset(self, source: Hashable) -> int | None:
        """The offset the next event of `source` must have; None before its start is known."""
        return self._next.get(source)

    def skip_to(self, source: Hashable, offset: int, now: float) -> None:
        """Offsets below `offset` were dealt with (read, or checked): the next event must be at
        `offset` or later; quiet from `now` again."""
        self._next[source] = max(offset, self._next.get(source, offset))
        self._quiet_from[source] = now

    def checked(self, source: Hashable, now: float) -> None:
        """`source` was compared with its high watermark: quiet from `now` again."""
        if source in self._quiet_from:
            self._quiet_from[source] = now

    def forget(self, sources: set[Any]) -> None:
        """Revoked partitions: their next owner starts from the committed offset again."""
        for source in sources:
            self._next.pop(source, None)
            self._quiet_from.pop(source, None)


class KafkaGapReader:
    """Reads a consumer group's committed offsets and ranges of records straight from Kafka,
    with a consumer that never joins the group (blocking calls: run them in a thread)."""

    def __init__(self, bootstrap_servers: str, group_id: str, *, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._group = Consumer(
            {"bootstrap.servers": bootstrap_servers, "group.id": group_id, "enable.auto.commit": False,
             "logger": kafka_logger()}
        )
        self._reader = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"{group_id}-gaps-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",  # as the Faust consumer reads
                "enable.partition.eof": True,  # a range may run to the end of the partition
                "logger": kafka_logger(),
            }
        )

    def start_offset(self, topic: str, partition: int) -> int:
        """Where the group reads `topic[partition]` from: its committed offset, or the earliest
        retained one when nothing is committed or the committed one was deleted."""
        where = TopicPartition(topic, partition)
        try:
            (committed,) = self._group.committed([where], timeout=self.timeout_s)
            low, _ = self._group.get_watermark_offsets(where, timeout=self.timeout_s)
        except KafkaException as exc:
            what = f"cannot read the committed offset of {topic}[{partition}]"
            raise kafka_failure(what, exc.args[0]) from exc
        if committed.offset == OFFSET_INVALID or committed.offset < low:
            return int(low)
        return int(committed.offset)

    def end_offset(self, topic: str, partition: int) -> int:
        """The high watermark of `topic[partition]`."""
        try:
            where = TopicPartition(topic, partition)
            _, high = self._group.get_watermark_offsets(where, timeout=self.timeout_s)
        except KafkaException as exc:
            raise kafka_failure(f"cannot read the end offset of {topic}[{partition}]", exc.args[0]) from exc
        return int(high)

    def read(self, topic: str, partition: int, offsets: range) -> list[Any]:
        """The records of `topic[partition]` at `offsets` (confluent-kafka messages, in order)."""
        self._reader.assign([TopicPartition(topic, partition, offsets.start)])
        found: list[Any] = []
        try:
            while True:
                message = self._reader.poll(self.timeout_s)
                if message is None:
                    raise BrokerUnavailableError(
                        f"records {offsets.start}..{offsets.stop - 1} of {topic}[{partition}] did not "
                        f"arrive within {self.timeout_s:.0f}s"
                    )
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    return found
                if error is not None and is_transient(error):
                    continue  # the consumer recovers by itself; the poll timeout bounds the wait
                if error is not None:
                    raise AssemblyError(f"cannot read {topic}[{partition}]: {error}")
                offset = message.offset()
                if offset is not None and offset >= offsets.stop:
                    return found
                found.append(message)
        finally:
            self._reader.unassign()

    def records_since(self, topic: str, timestamp_ms: int) -> list[Any]:
        """Every record of `topic` written at or after `timestamp_ms`, each partition read to
        its end (the broker's time index finds where)."""
        try:
            metadata = self._group.list_topics(topic, timeout=self.timeout_s).topics[topic]
            if metadata.error is not None:
                raise KafkaException(metadata.error)
            wanted = [TopicPartition(topic, p, timestamp_ms) for p in sorted(metadata.partitions)]
            starts = self._group.offsets_for_times(wanted, timeout=self.timeout_s)
        except KafkaException as exc:
            what = f"cannot find the records of {topic} since {timestamp_ms}"
            raise kafka_failure(what, exc.args[0]) from exc
        found: list[Any] = []
        for start in starts:
            if start.offset < 0:  # no record that recent
                continue
            end = self.end_offset(topic, start.partition)
            if start.offset < end:
                found += self.read(topic, start.partition, range(start.offset, end))
        return found

    def close(self) -> None:
        self._group.close()
        self._reader.close()


class InputOrder:
    """Each event of the held inputs once, in offset order: an `OffsetGuard` and a `GapReader`
    (its blocking calls run in a thread). Sources are Faust `TP`s (`.topic`, `.partition`)."""

    def __init__(
        self,
        reader: Callable[[], GapReader],
        *,
        quiet_s: float,
        max_read: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.guard = OffsetGuard()
        self.quiet_s = quiet_s
        self.max_read = max_read
        """Most records a quiet check reads at once (a worker far behind gets the rest from
        Faust, or from the next check)."""
        self._reader = reader
        self._clock = clock

    async def assigned(self, sources: set[Any]) -> None:
        """`sources` were assigned: read where each starts (its first event then goes straight
        through)."""
        self.guard.assigned(sources, self._clock())
        for source in sources:
            await self._ensure_start(source)

    async def events(
        self, event: Any, *, held: tuple[str, ...], ticks: str, ticked: tuple[str, ...]
    ) -> list[Any] | None:
        """The events to process for one delivered Faust `event`, in offset order. For an event
        of a `held` topic: None when it was taken before, else the records Faust dropped ahead of
        it (read from Kafka, as `Refetched`) and itself. A tick (an event of `ticks`) also brings
        what the quiet partitions of `ticked` with its partition number never got; an event of
        any other topic comes alone. Raises `AssemblyError` when Kafka does not answer."""
        message = event.message
        if message.topic == ticks:
            missing: list[Any] = []
            for topic in ticked:
                source = TP(topic, message.partition)
                stalled = await self.stalled(source)
                missing += [Refetched.of(r, source, message.generation_id) for r in stalled]
            return [*missing, event]
        if message.topic not in held:
            return [event]
        found = await self.take(message.tp, message.offset)
        if found is None:
            return None
        return [*(Refetched.of(r, message.tp, message.generation_id) for r in found), event]

    async def assigned_of(self, assigned: set[Any], topics: tuple[str, ...]) -> None:
        """`assigned` (a rebalance's partitions): those of `topics` start now; a start Kafka
        does not give is logged and asked again at the partition's first event."""
        try:
            await self.assigned({tp for tp in assigned if tp.topic in topics})
        except AssemblyError as exc:
            log.warning("cannot read the committed offsets of the assigned partitions: %s", exc)

    def forget(self, sources: set[Any]) -> None:
        self.guard.forget(sources)

    async def take(self, source: Any, offset: int) -> list[Any] | None:
        """An event of `source` at `offset` arrived. None: skip it, it was taken before;
        otherwise the records Faust dropped before it, to process first (usually none)."""
        await self._ensure_start(source)
        expected = self.guard.next_offset(source)
        if expected is not None and offset < expected:
            log.debug("%s[%s]@%s delivered again: skipped", source.topic, source.partition, offset)
            return None
        found: list[Any] = []
        if expected is not None and expected < offset:
            log.warning(
                "%s[%s]: offsets %d..%d were not delivered by the consumer, reading them from Kafka",
                source.topic, source.partition, expected, offset - 1,
            )  # fmt: skip
            missing = range(expected, offset)
            found = await asyncio.to_thread(self._reader().read, source.topic, source.partition, missing)
        self.guard.admit(source, offset, self._clock())  # after the read: a failed one is asked again
        return found

    async def stalled(self, source: Any) -> list[Any]:
        """The records of a quiet `source` that Kafka has and its agent never got (read now)."""
        now = self._clock()
        if not self.guard.quiet(source, now, self.quiet_s):
            return []
        await self._ensure_start(source)
        end = await asyncio.to_thread(self._reader().end_offset, source.topic, source.partition)
        missing = self.guard.stalled(source, end, now, self.quiet_s)
        if not missing:
            self.guard.skip_to(source, 0, now)
            return []
        missing = range(missing.start, min(missing.stop, missing.start + self.max_read))
        log.warning(
            "%s[%s]: nothing arrived for %gs, offsets %d..%d were not delivered by the consumer, "
            "reading them from Kafka",
            source.topic, source.partition, self.quiet_s, missing.start, missing.stop - 1,
        )  # fmt: skip
        found = await asyncio.to_thread(self._reader().read, source.topic, source.partition, missing)
        self.guard.skip_to(source, missing.stop, now)  # after the read: a failed one is asked again
        return found

    async def behind(self, source: Any) -> bool:
        """Whether a quiet `source` may have records its agent never got (then an event on it
        makes the agent check, through `take`). Does not change what the agent expects."""
        now = self._clock()
        if not self.guard.quiet(source, now, self.quiet_s):
            return False
        self.guard.checked(source, now)
        end = await asyncio.to_thread(self._reader().end_offset, source.topic, source.partition)
        expected = self.guard.next_offset(source)
        return end > (expected if expected is not None else 0)

    async def _ensure_start(self, source: Any) -> None:
        if not self.guard.knows(source):
            reader = self._reader()
            start = await asyncio.to_thread(reader.start_offset, source.topic, source.partition)
            if not self.guard.knows(source):  # another task may have started it meanwhile
                self.guard.start(source, start, self._clock())


@dataclass(slots=True)
class Refetched:
    """An input event Faust dropped, read straight from Kafka (`gaps`): acknowledged through
    the consumer, like the stream acknowledges the events it delivered."""

    message: faust.types.Message
    value: bytes | None

    @classmethod
    def of(cls, record: Any, tp: TP, generation_id: int) -> Refetched:
        """From a confluent-kafka `record` of `tp`."""
        message = faust.types.Message(
            record.topic(),
            record.partition(),
            record.offset(),
            record.timestamp()[1] / 1000.0,
            record.timestamp()[0],
            record.headers() or [],
            record.key(),
            record.value(),
            None,
            tp=tp,
            generation_id=generation_id,
        )
        return cls(message, record.value())


async def ack(stream: faust.StreamT, event: Any) -> None:
    """Acknowledge a processed event: through the stream, or the consumer for a `Refetched` one."""
    if isinstance(event, Refetched):
        stream.app.consumer.ack(event.message)
    else:
        await stream.ack(event)
