"""EventConsumer: Kafka -> typed records, manual commits, replay seeks, lag, dead letters."""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context

from stacx.consumers.dead_letters import keep_original
from stacx.consumers.errors import (
    CommitRefusedError,
    ConsumerClosedError,
    ConsumerError,
    UnexpectedRecordError,
)
from stacx.producers import BlobStoreError, Delivery, EventProducer, FsspecBlobStore, context_from_headers
from stacx.producers.event_producer import registry_client
from stacx.producers.kafka_log import kafka_logger
from stacx.schemas import topics as topic_names
from stacx.schemas.catalogue import SchemaCatalogue
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import Codec
from stacx.schemas.errors import SchemaError
from stacx.schemas.records import DeadLetter
from stacx.schemas.validation import validate as validate_record

__all__ = ["ConsumedEvent", "EventConsumer", "Validator"]

log = logging.getLogger(__name__)

Validator = Callable[[object], None]
"""Raises (any exception) when a decoded record must not be handed out; it then goes to the DLQ."""

_PARTITION_EOF = -191
_OFFSET_END = -1


@dataclass(slots=True)
class ConsumedEvent:
    """One decoded event and where it came from."""

    value: Any
    """The typed record (schemas/records.py), claim checks already resolved."""
    key: str | None
    """The Kafka key, decoded as UTF-8."""
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    """Kafka timestamp (CreateTime by default) in epoch milliseconds."""
    headers: dict[str, bytes] = field(default_factory=dict)

    @property
    def trace_context(self) -> Context:
        """The OpenTelemetry context the producer injected (use as `parent`/`context=`)."""
        return context_from_headers(self.headers)


def _bootstrap_default() -> str:
    return os.environ.get(topic_names.BOOTSTRAP_ENV, topic_names.DEFAULT_BOOTSTRAP)


class EventConsumer:
    """Polls topics and yields typed records; bad events go to the DLQ and consumption goes on.

    Offsets are committed only by `commit()`. `seek_to_timestamp` / `seek` replay retained
    events; when called before the group assigned partitions, they apply on assignment.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        bootstrap_servers: str = field(default_factory=_bootstrap_default)
        """Kafka bootstrap.servers (default: $STACX_KAFKA or 127.0.0.1:9092)."""
        group_id: str = "stacx"
        """Consumer group: members share the partitions and the committed offsets."""
        topics: list[str] = field(default_factory=list)
        """Topics to subscribe to."""
        client_id: str = "stacx-consumer"
        """client.id shown in broker logs and metrics."""
        auto_offset_reset: str = "earliest"
        """Where a group without committed offsets starts: earliest or latest."""
        dlq_topic: str | None = topic_names.DLQ
        """Dead-letter topic for undecodable or invalid events; None only logs them."""
        validate: bool = True
        """Check record invariants (stacx.schemas.validation) and dead-letter violations."""
        resolve_claim_checks: bool = True
        """Fetch claim-checked records from the blob store (False hands out the ClaimCheck)."""
        schema_registry_url: str | None = None
        """Confluent schema registry URL for events in the Confluent wire format."""
        schemas_topic: str = topic_names.SCHEMAS
        """Schema catalogue topic, read to resolve unknown writer schemas."""
        session_timeout_ms: int = 10_000
        """session.timeout.ms: a member killed without leaving holds its partitions this long,
        so a restarted service reads again within about this time (Kafka's default is 45 s)."""
        max_poll_interval_ms: int = 300_000
        """max.poll.interval.ms: the longest gap between polls before the group evicts us."""
        fetch_queue_backoff_ms: int = 10
        """fetch.queue.backoff.ms: how long librdkafka postpones fetching once its local queue is
        full. Its 1,000 ms default stalls a reader slower than the fetch (decoding 20 KB
        trajectories) for a second at a time: 3-5x fewer records/s."""
        decode_chunk: int = 64
        """`consume()` takes messages from librdkafka's local queue this many at a time and
        decodes each chunk at once, while the bytes librdkafka just copied are still in the
        CPU cache: ~3 us less CPU per 20 KB trajectory than decoding 1,000 copied at once."""
        kafka: dict[str, Any] = field(default_factory=dict)
        """Extra librdkafka options (override everything above)."""

        def __post_init__(self) -> None:
            if not self.topics:
                raise ValueError("EventConsumer.Config.topics is empty: name at least one topic")
            if self.fetch_queue_backoff_ms < 0:
                raise ValueError(
                    f"EventConsumer.Config.fetch_queue_backoff_ms={self.fetch_queue_backoff_ms}: use >= 0"
                )
            if self.decode_chunk < 1:
                raise ValueError(f"EventConsumer.Config.decode_chunk={self.decode_chunk}: use >= 1")
            if self.auto_offset_reset not in {"earliest", "latest"}:
                raise ValueError(
                    f"EventConsumer.Config.auto_offset_reset={self.auto_offset_reset!r}: "
                    "use earliest or latest"
                )

    def __init__(
        self,
        config: Config,
        *,
        validator: Validator | None = None,
        expected: type | tuple[type, ...] | None = None,
        on_assign: Callable[[list[tuple[str, int]]], None] | None = None,
        on_revoke: Callable[[list[tuple[str, int]]], None] | None = None,
        on_lost: Callable[[list[tuple[str, int]]], None] | None = None,
    ) -> None:
        """`validator` rejects records (raise anything) and `expected` names the record types
        this consumer reads; events failing either go to the DLQ like undecodable ones.
        `on_assign` is called with the (topic, partition) pairs of each new assignment (from the
        thread that polls, after the group's rebalance); `on_revoke` with those taken away, before
        the group hands them on (the last moment this member may commit them); `on_lost` (default:
        `on_revoke`) with those the group already gave to others (this member's session expired:
        a partition, a long pause), which it may no longer commit."""
        from confluent_kafka import Consumer

        self.config = config
        self._validator = validator
        self._expected = expected
        self._assign_listener = on_assign
        self._revoke_listener = on_revoke
        self._lost_listener = on_lost or on_revoke
        self._catalogue = SchemaCatalogue(
            SchemaCatalogue.Config(
                bootstrap_servers=config.bootstrap_servers, topic=config.schemas_topic, create_topic=False
            )
        )
        registry = registry_client(config.schema_registry_url) if config.schema_registry_url else None
        self.codec = Codec(resolver=self._catalogue.lookup, registry=registry)
        self._dlq: EventProducer | None = None
        self._dlq_sent: list[Future[Delivery]] = []
        self._pending_seeks: list[Callable[[list[Any]], list[Any]]] = []
        self._closed = False
        self._paused = False
        self.num_dead_letters = 0
        """Events sent to the DLQ (or dropped with a log line when there is none)."""
        self._consumer = Consumer(self._librdkafka_config(config))
        self._consumer.subscribe(
            list(config.topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    # -- reading -----------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> ConsumedEvent | None:
        """The next good event, or None when none arrived within `timeout` seconds."""
        self._check_open()
        deadline = time.monotonic() + timeout
        while True:
            msg = self._consumer.poll(max(deadline - time.monotonic(), 0.0))
            event = self._handle(msg) if msg is not None else None
            if event is not None or msg is None or time.monotonic() >= deadline:
                return event

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[ConsumedEvent]:
        """Up to `max_records` good events, returning early after `timeout` seconds (< 0: none).

        Messages are taken from librdkafka in chunks of `Config.decode_chunk`, each decoded
        while its bytes are fresh in the CPU cache, with Python's cyclic garbage collector
        paused while the batch is built, except while waiting for the broker (see
        `_CollectorPause`).
        """
        self._check_open()
        deadline = time.monotonic() + timeout
        events: list[ConsumedEvent] = []
        num_read = 0
        with _CollectorPause() as pause:
            while num_read < max_records:
                wanted = min(self.config.decode_chunk, max_records - num_read)
                messages = self._consumer.consume(wanted, 0)  # those already fetched: no wait
                if len(messages) < wanted and timeout != 0:
                    left = -1.0 if timeout < 0 else max(deadline - time.monotonic(), 0.0)  # -1: no limit
                    with pause.lifted():
                        messages += self._consumer.consume(wanted - len(messages), left)
                num_read += len(messages)
                events += [e for e in map(self._handle, messages) if e is not None]
                if len(messages) < wanted:  # the deadline passed
                    break
        return events

    def __iter__(self) -> Iterator[ConsumedEvent]:
        """Events forever (until `close()`)."""
        while not self._closed:
            event = self.poll(1.0)
            if event is not None:
                yield event

    # -- offsets -----------------------------------------------------------------------------

    def commit(self, events: ConsumedEvent | Iterable[ConsumedEvent] | None = None) -> None:
        """Commit synchronously: past `events`, or (None) past everything polled so far.

        Dead letters produced so far are flushed first, so no event is committed unaccounted.
        CommitRefusedError when the group moved on since the events were read (the events are
        redelivered); ConsumerError for any other failure.
        """
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        self._check_open()
        self._flush_dlq()
        if events is None:
            try:
                self._commit_waiting(lambda: self._consumer.commit(asynchronous=False))
            except KafkaException as exc:
                if _error_code(exc) != KafkaError._NO_OFFSET:  # _NO_OFFSET: nothing read since
                    raise _commit_error(exc) from exc
            return
        batch = [events] if isinstance(events, ConsumedEvent) else list(events)
        ends: dict[tuple[str, int], int] = {}
        for e in batch:
            ends[(e.topic, e.partition)] = max(ends.get((e.topic, e.partition), 0), e.offset + 1)
        if ends:
            offsets = [TopicPartition(t, p, o) for (t, p), o in ends.items()]
            try:
                self._commit_waiting(lambda: self._consumer.commit(offsets=offsets, asynchronous=False))
            except KafkaException as exc:
                raise _commit_error(exc) from exc

    def commit_positions(
        self, positions: Mapping[tuple[str, int], tuple[int, str]], *, wait_s: float | None = None
    ) -> None:
        """Commit (next offset to read, metadata) per (topic, partition), synchronously: the
        metadata (at most the broker's `offset.metadata.max.bytes`, 4 KiB by default) is handed
        to whoever reads the partition next (`committed_positions`). A coordinator that is away
        is waited for `wait_s` (default `COMMIT_WAIT_S`). Errors as `commit()`."""
        from confluent_kafka import KafkaException, TopicPartition

        self._check_open()
        self._flush_dlq()
        if not positions:
            return
        offsets = [
            TopicPartition(topic, partition, offset, metadata=metadata)
            for (topic, partition), (offset, metadata) in positions.items()
        ]
        try:
            self._commit_waiting(lambda: self._consumer.commit(offsets=offsets, asynchronous=False), wait_s)
        except KafkaException as exc:
            raise _commit_error(exc) from exc

    def committed_positions(
        self, partitions: Iterable[tuple[str, int]], timeout: float = 10.0
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """The group's committed (offset, metadata) per (topic, partition); offset < 0 where
        nothing was committed yet."""
        from confluent_kafka import KafkaException, TopicPartition

        self._check_open()
        query = [TopicPartition(topic, partition) for topic, partition in partitions]
        if not query:
            return {}
        try:
            found = self._consumer.committed(query, timeout=timeout)
        except KafkaException as exc:
            raise ConsumerError(f"reading the committed offsets failed: {exc}", retriable=True) from exc
        return {(tp.topic, tp.partition): (tp.offset, tp.metadata or "") for tp in found}

    COMMIT_WAIT_S = 60.0
    """How long a commit waits out a coordinator that is loading or moving (a broker restart)."""

    def _commit_waiting(self, commit: Callable[[], Any], wait_s: float | None = None) -> None:
        """`commit()`, retried with backoff while the group coordinator is loading, moving or
        unreachable (KafkaException for anything else, or once `wait_s`, by default
        `COMMIT_WAIT_S`, has passed)."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + (self.COMMIT_WAIT_S if wait_s is None else wait_s)
        delay = 0.1
        while True:
            try:
                commit()
                return
            except KafkaException as exc:
                if _error_code(exc) not in _coordinator_busy() or time.monotonic() + delay > deadline:
                    raise
                log.warning("commit waits for the group coordinator (%s): retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read `topic`/`partition` from `offset` next.

        Before the group assigned partitions, seeks are remembered and applied on assignment.
        """
        from confluent_kafka import TopicPartition

        def resolve(parts: list[Any]) -> list[Any]:
            return [
                TopicPartition(topic, partition, offset)
                for p in parts
                if (p.topic, p.partition) == (topic, partition)
            ]

        self._seek(resolve)

    def seek_to_timestamp(self, timestamp_ms: int, timeout: float = 10.0) -> None:
        """Replay: every assigned partition continues at its first event at or after `timestamp_ms`."""
        from confluent_kafka import TopicPartition

        def resolve(parts: list[Any]) -> list[Any]:
            query = [TopicPartition(p.topic, p.partition, timestamp_ms) for p in parts]
            found = self._consumer.offsets_for_times(query, timeout=timeout)
            return [
                TopicPartition(p.topic, p.partition, p.offset if p.offset >= 0 else _OFFSET_END)
                for p in found
            ]

        self._seek(resolve)

    def seek_to_beginning(self) -> None:
        """Replay every assigned partition from its first retained event."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self._seek(lambda parts: [TopicPartition(p.topic, p.partition, OFFSET_BEGINNING) for p in parts])

    def offsets(self, timeout: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
        """(position, end) per assigned (topic, partition): the next offset this member reads
        (its committed one, or the reset point, before its first read) and the partition's end."""
        self._check_open()
        offsets: dict[tuple[str, int], tuple[int, int]] = {}
        for tp in self._consumer.assignment():
            low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
            position = self._consumer.position([tp])[0].offset
            if position < 0:
                committed = self._consumer.committed([tp], timeout=timeout)[0].offset
                position = (
                    committed
                    if committed >= 0
                    else (low if self.config.auto_offset_reset == "earliest" else high)
                )
            offsets[(tp.topic, tp.partition)] = (position, high)
        return offsets

    def lag(self, timeout: float = 10.0) -> dict[tuple[str, int], int]:
        """Events not yet consumed, per assigned (topic, partition)."""
        return {tp: max(end - position, 0) for tp, (position, end) in self.offsets(timeout).items()}

    def total_lag(self, timeout: float = 10.0) -> int:
        """Sum of `lag()` over the assigned partitions."""
        return sum(self.lag(timeout).values())

    def assignment(self) -> list[tuple[str, int]]:
        """(topic, partition) pairs currently assigned to this member."""
        return [(tp.topic, tp.partition) for tp in self._consumer.assignment()]

    def pause(self) -> None:
        """Fetch nothing from the assigned partitions, nor from those a rebalance assigns later,
        until `resume()`. `poll` still serves the group: a member that waits while paused keeps
        its place, and a rebalance (a peer joining or leaving) completes without waiting for it
        to be polled again (up to `max_poll_interval_ms`)."""
        self._paused = True
        self._consumer.pause(self._consumer.assignment())

    def resume(self) -> None:
        """Fetch again from every assigned partition, from where reading stopped."""
        self._paused = False
        self._consumer.resume(self._consumer.assignment())

    def close(self) -> None:
        """Flush dead letters and leave the group (uncommitted events will be redelivered)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._flush_dlq()
        except ConsumerError as exc:  # their source events were not committed: redelivered later
            log.error("%s", exc)
        finally:
            if self._dlq is not None:
                self._dlq.close()
            self._catalogue.close()
            self._consumer.close()

    def __enter__(self) -> EventConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _handle(self, msg: Any) -> ConsumedEvent | None:
        err = msg.error()
        if err is not None:
            if err.code() != _PARTITION_EOF:
                if err.fatal():
                    raise ConsumerError(f"fatal consumer error: {err}")
                log.warning("consumer error on %s: %s", msg.topic(), err)
            return None
        value = msg.value()
        if value is None:  # tombstone in a compacted topic
            return None
        try:
            record = self._decode(value)
        except Exception as exc:  # any decode/validation failure: dead-letter it, keep consuming
            self._dead_letter(msg, exc)
            return None
        key = msg.key()
        headers = msg.headers()
        return ConsumedEvent(
            record,
            key.decode("utf-8", "replace") if key is not None else None,
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.timestamp()[1],
            dict(headers) if headers else {},
        )

    def _decode(self, value: bytes) -> Any:
        record = self.codec.decode(value)
        if isinstance(record, ClaimCheck) and self.config.resolve_claim_checks:
            record = self.codec.decode(FsspecBlobStore.get(record.uri, sha256=record.sha256))
        if self._expected is not None and not isinstance(record, self._expected):
            raise UnexpectedRecordError(
                f"a {type(record).__name__} event where this consumer reads only "
                f"{_type_names(self._expected)}: it was published to the wrong topic"
            )
        if self.config.validate:
            validate_record(record)
        if self._validator is not None:
            self._validator(record)
        return record

    def dead_letter(self, event: ConsumedEvent, exc: Exception) -> None:
        """Set aside an event already handed out that its reader cannot use (the trainer's last
        check of a batch): a `DeadLetter` with the reason, the original key and headers, and the
        record re-encoded. Counted in `num_dead_letters`; commit past it as usual."""
        key = event.key.encode() if event.key is not None else None
        letter = DeadLetter(
            source_topic=event.topic,
            source_partition=event.partition,
            source_offset=event.offset,
            reason=f"{type(exc).__name__}: {exc}",
            error_type=type(exc).__name__,
            key=key,
            value=self.codec.encode(event.value),
            headers=_text_headers(event.headers.items()),
        )
        self._send_dead_letter(letter, exc)

    def _dead_letter(self, msg: Any, exc: Exception) -> None:
        value, note = msg.value(), ""
        if self.config.dlq_topic is not None:  # a claim check's blob is copied beside the DLQ
            value, note = keep_original(msg.value(), dlq_topic=self.config.dlq_topic)
        letter = DeadLetter(
            source_topic=msg.topic(),
            source_partition=msg.partition(),
            source_offset=msg.offset(),
            reason=f"{type(exc).__name__}: {exc}{note}",
            error_type=type(exc).__name__,
            key=msg.key(),
            value=value,
            headers=_text_headers(msg.headers() or []),
        )
        self._send_dead_letter(letter, exc)

    def _send_dead_letter(self, letter: DeadLetter, exc: Exception) -> None:
        self.num_dead_letters += 1
        where = f"{letter.source_topic}/{letter.source_partition}@{letter.source_offset}"
        if self.config.dlq_topic is None:
            log.error("dropping event %s (no DLQ configured): %s", where, letter.reason)
            return
        known = isinstance(exc, (SchemaError, BlobStoreError, ConsumerError))
        log.warning("event %s -> DLQ %s: %s", where, self.config.dlq_topic, letter.reason if known else exc)
        self._dlq_sent.append(
            self._dlq_producer().publish(
                self.config.dlq_topic, letter, key=letter.key, headers=_trace_of(letter.headers)
            )
        )

    def _dlq_producer(self) -> EventProducer:
        if self._dlq is None:
            self._dlq = EventProducer(
                EventProducer.Config(
                    bootstrap_servers=self.config.bootstrap_servers,
                    client_id=f"{self.config.client_id}-dlq",
                    schemas_topic=self.config.schemas_topic,
                    linger_ms=0,
                )
            )
        return self._dlq

    def _flush_dlq(self) -> None:
        """Wait for the dead letters sent so far; raise (so nothing is committed past them) if any failed."""
        if self._dlq is None or not self._dlq_sent:
            return
        self._dlq.flush(30.0)
        failed = [f for f in self._dlq_sent if not f.done() or f.exception() is not None]
        self._dlq_sent = [f for f in self._dlq_sent if not f.done()]
        if failed:
            raise ConsumerError(
                f"{len(failed)} dead letter(s) not acknowledged by {self.config.dlq_topic!r}; "
                "not committing past them (they will be redelivered)",
                retriable=True,
            )

    def _seek(self, resolve: Callable[[list[Any]], list[Any]]) -> None:
        self._check_open()
        assigned = self._consumer.assignment()
        if not assigned:
            self._pending_seeks.append(resolve)
            return
        for tp in resolve(assigned):
            self._consumer.seek(tp)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        if self._pending_seeks and partitions:
            moved = {
                (tp.topic, tp.partition): tp for resolve in self._pending_seeks for tp in resolve(partitions)
            }
            partitions = [moved.get((p.topic, p.partition), p) for p in partitions]
            self._pending_seeks.clear()
        consumer.assign(partitions)
        if partitions:  # a partition paused under an earlier assignment would stay paused
            (consumer.pause if self._paused else consumer.resume)(partitions)
        if self._assign_listener is not None:
            self._assign_listener([(p.topic, p.partition) for p in partitions])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._unassigned(consumer, partitions, self._revoke_listener)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._unassigned(consumer, partitions, self._lost_listener)

    @staticmethod
    def _unassigned(
        consumer: Any, partitions: list[Any], listener: Callable[[list[tuple[str, int]]], None] | None
    ) -> None:
        try:
            if listener is not None:
                listener([(p.topic, p.partition) for p in partitions])
        finally:
            consumer.unassign()

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("EventConsumer is closed")

    @staticmethod
    def _librdkafka_config(config: Config) -> dict[str, Any]:
        return {
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": config.group_id,
            "client.id": config.client_id,
            "enable.auto.commit": False,
            "auto.offset.reset": config.auto_offset_reset,
            "session.timeout.ms": config.session_timeout_ms,
            "max.poll.interval.ms": config.max_poll_interval_ms,
            "fetch.queue.backoff.ms": config.fetch_queue_backoff_ms,
            "logger": kafka_logger(),
            "isolation.level": "read_committed",
            **config.kafka,
        }


class _CollectorPause:
    """Python's cyclic collector paused while a batch is built (restored as found, even on error).

    Decoding a batch allocates thousands of container objects (records, turns, events) that
    all stay alive until the caller is done with the batch, and that hold no reference cycles.
    A collection in between scans them for nothing and promotes them to older generations,
    whose next full collection scans them (and the whole heap) again: it cost about 1.5 us
    per 20 KB trajectory while decoding took ~15 us (pure-Python readers). Collections are
    only deferred: the next allocation after the block runs them if their thresholds were
    passed. A collector already paused (by the caller or another thread) is left alone.
    """

    def __enter__(self) -> _CollectorPause:
        self._paused = gc.isenabled()
        if self._paused:
            gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._paused:
            gc.enable()

    @contextmanager
    def lifted(self) -> Iterator[None]:
        """The collector running again meanwhile (a wait for the broker: other threads go on)."""
        if not self._paused:
            yield
            return
        gc.enable()
        try:
            yield
        finally:
            gc.disable()


_TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


def _error_code(exc: Exception) -> int | None:
    from confluent_kafka import KafkaError

    return exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None


def _coordinator_busy() -> frozenset[int]:
    """Commit errors of a group coordinator that is loading, moving or not reachable yet: the
    commit succeeds once it is back, so it is retried instead of failing the consumer."""
    from confluent_kafka import KafkaError

    return frozenset({KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
                      KafkaError.NOT_COORDINATOR, KafkaError._WAIT_COORD, KafkaError._TRANSPORT,
                      KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT})


def _commit_error(exc: Exception) -> ConsumerError:
    """CommitRefusedError when the broker refused the commit because the group moved on."""
    from confluent_kafka import KafkaError

    moved_on = (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                KafkaError.REBALANCE_IN_PROGRESS, KafkaError.FENCED_INSTANCE_ID)
    if _error_code(exc) in moved_on:
        return CommitRefusedError(f"commit refused, the group moved on since these events were read "
                                  f"(they are redelivered): {exc}")
    return ConsumerError(f"commit failed: {exc}")


def _trace_of(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The original event's trace context, carried on by its dead letter's own Kafka headers."""
    kept = {k: headers[k] for k in _TRACE_HEADERS if k in headers}
    return kept or None


def _text_headers(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    return {k: v.decode("utf-8", "replace") for k, v in headers if v is not None}


def _type_names(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(t.__name__ for t in types)
