"""`EventRecorder`: hands interaction and feedback events to Kafka without ever blocking traffic.

`record()` only appends to a bounded in-memory buffer and returns at once. A background thread
publishes the buffered events; an event leaves the buffer only when the broker acknowledged it,
and a failed delivery (Kafka down, slow, refusing) is retried after `retry_backoff_s`. When the
buffer holds `max_buffered` events, new events are dropped and counted, and the recorder is
*degraded* (gauge `stacx_proxy_degraded` = 1, one warning in the log) until the buffer has
drained below half of its bound: production calls are always answered, only their records are
lost, and the metrics say how many.

Poison never blocks the queue: a failure the same event would meet on every retry (an invalid
record, one the codec cannot encode) is *permanent*; the event leaves the buffer as a `DeadLetter`
on `dlq_topic` with the reason, and the events behind it flow. `problem()` says what is stuck
(events waiting for a retry), so `/health` reads degraded while anything is.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from stacx.producers.errors import ProducerError
from stacx.producers.protocols import Publisher
from stacx.rollout.proxy.errors import ProxyConfigError
from stacx.rollout.proxy.metrics import ProxyMetrics
from stacx.schemas import topics
from stacx.schemas.errors import SchemaError
from stacx.schemas.identity import record_key
from stacx.schemas.records import DeadLetter

__all__ = ["EventRecorder", "PendingEvent", "dead_letter", "is_permanent", "refused_letter"]

MAX_LETTER_BYTES = 64 << 10
"""Most of a refused request body kept in its dead letter."""

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class PendingEvent:
    """One event waiting for the broker's acknowledgement."""

    seq: int
    """Arrival order: retries go out before newer events, so a session's events keep their order."""
    topic: str
    record: object
    headers: Mapping[str, str | bytes] = field(default_factory=dict)
    attempts: int = 0
    not_before: float = 0.0
    """Monotonic time before which it is not retried."""


class EventRecorder:
    """Bounded, non-blocking buffer in front of a `Publisher` (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        max_buffered: int = 10_000
        """Events kept until acknowledged; beyond this new events are dropped (degraded mode)."""
        retry_backoff_s: float = 1.0
        """Wait before re-publishing an event whose delivery failed."""
        max_in_flight: int = 1_000
        """Events handed to the publisher and not yet acknowledged, at most."""
        dlq_topic: str = topics.DLQ
        """Where an event that can never be delivered (invalid, unencodable) goes, with why."""

        def __post_init__(self) -> None:
            if self.max_buffered < 1:
                raise ProxyConfigError(f"recorder.max_buffered={self.max_buffered}: keep at least 1 event")
            if self.max_in_flight < 1 or self.retry_backoff_s < 0:
                raise ProxyConfigError(
                    "recorder.max_in_flight must be >= 1 and recorder.retry_backoff_s >= 0"
                )

    def __init__(self, config: Config, publisher: Publisher, metrics: ProxyMetrics | None = None) -> None:
        self.config = config
        self.publisher = publisher
        self.metrics = metrics or ProxyMetrics()
        self._waiting: list[tuple[int, PendingEvent]] = []  # heap by arrival order
        self._seq = itertools.count()
        self._in_flight = 0
        self._cond = threading.Condition()
        self._stopped = False
        self.degraded = False
        self._thread = threading.Thread(target=self._run, name="stacx-proxy-recorder", daemon=True)
        self._thread.start()

    # -- producer side (request handlers) ---------------------------------------------------

    @property
    def num_buffered(self) -> int:
        """Events not yet acknowledged (waiting + in flight)."""
        return len(self._waiting) + self._in_flight

    def problem(self) -> str | None:
        """Why the recorder is not healthy (events stuck waiting for a retry, or dropped);
        None when it is."""
        with self._cond:
            retrying = sum(1 for _, event in self._waiting if event.attempts)
        if retrying:
            return f"{retrying} events waiting for a retry: Kafka refuses or does not answer"
        if self.degraded:
            return f"buffer full ({self.num_buffered} events): new events are dropped"
        return None

    def record(self, topic: str, record: object, headers: Mapping[str, str | bytes] | None = None) -> bool:
        """Buffer `record` for `topic`; False (and counted) when the buffer is full. Never blocks."""
        with self._cond:
            if self.num_buffered >= self.config.max_buffered:
                self._enter_degraded()
                self.metrics.inc("events_dropped_total")
                return False
            event = PendingEvent(seq=next(self._seq), topic=topic, record=record, headers=dict(headers or {}))
            heapq.heappush(self._waiting, (event.seq, event))
            self.metrics.inc("events_recorded_total")
            self._update_gauges()
            self._cond.notify()
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every buffered event is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.num_buffered:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Try to deliver what is buffered within `timeout_s`, then stop (the rest is counted lost)."""
        self.flush(timeout_s)
        with self._cond:
            self._stopped = True
            lost = self.num_buffered
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        if lost:
            log.error("proxy recorder closed with %d events undelivered", lost)
            self.metrics.inc("events_dropped_total", lost)

    # -- consumer side (background thread) --------------------------------------------------

    def _run(self) -> None:
        while True:
            event = self._next()
            if event is None:
                return
            self._publish(event)

    def _next(self) -> PendingEvent | None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                if self._waiting and self._in_flight < self.config.max_in_flight:
                    head = self._waiting[0][1]
                    if head.not_before <= now:
                        heapq.heappop(self._waiting)
                        self._in_flight += 1
                        return head
                    self._cond.wait(head.not_before - now)
                    continue
                self._cond.wait(0.5)
            return None

    def _publish(self, event: PendingEvent) -> None:
        event.attempts += 1
        try:
            future: Future[Any] = self.publisher.publish(event.topic, event.record, headers=event.headers)
        except Exception as exc:  # a publisher that cannot even enqueue (catalogue unreachable...)
            self._failed(event, exc)
            return
        future.add_done_callback(lambda f: self._done(event, f))

    def _done(self, event: PendingEvent, future: Future[Any]) -> None:
        exc = future.exception()
        if exc is not None:
            self._failed(event, exc)
            return
        with self._cond:
            self._in_flight -= 1
            self.metrics.inc("events_published_total")
            if self.degraded and self.num_buffered <= self.config.max_buffered // 2:
                self.degraded = False
                log.warning("proxy recorder recovered: %d events buffered", self.num_buffered)
            self._update_gauges()
            self._cond.notify_all()

    def _failed(self, event: PendingEvent, exc: BaseException) -> None:
        if is_permanent(exc) and event.topic != self.config.dlq_topic:
            self._dead_letter(event, exc)
            return
        if event.attempts == 1 or event.attempts % 10 == 0:
            log.warning(
                "event to %s not delivered (attempt %d): %s; retrying", event.topic, event.attempts, exc
            )
        with self._cond:
            self._in_flight -= 1
            self.metrics.inc("delivery_failures_total")
            event.not_before = time.monotonic() + self.config.retry_backoff_s
            heapq.heappush(self._waiting, (event.seq, event))  # before newer events: order kept
            self._cond.notify_all()

    def _dead_letter(self, event: PendingEvent, exc: BaseException) -> None:
        """Replace `event` (in its place in the queue) by its dead letter: the rest flows."""
        log.error(
            "event to %s can never be delivered (%s): sent to %s", event.topic, exc, self.config.dlq_topic
        )
        letter = dead_letter(event.topic, event.record, exc, event.headers)
        with self._cond:
            self._in_flight -= 1
            self.metrics.inc("events_dead_lettered_total")
            replacement = PendingEvent(
                seq=event.seq, topic=self.config.dlq_topic, record=letter, headers=dict(event.headers)
            )
            heapq.heappush(self._waiting, (replacement.seq, replacement))
            self._cond.notify_all()

    def _enter_degraded(self) -> None:
        if not self.degraded:
            self.degraded = True
            log.warning(
                "proxy recorder degraded: %d events buffered (max_buffered); new events are "
                "dropped until Kafka catches up",
                self.num_buffered,
            )
        self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.set("buffered_events", self.num_buffered)
        self.metrics.set("degraded", 1.0 if self.degraded else 0.0)


def is_permanent(exc: BaseException) -> bool:
    """True for a failure the same event meets on every retry: the record itself is invalid or
    cannot be encoded. Delivery trouble (broker down, slow, closing) is never permanent."""
    if isinstance(exc, SchemaError):  # RecordValidationError, CodecError
        return not exc.retriable
    if isinstance(exc, ProducerError):
        return False
    return isinstance(exc, ValueError | TypeError | OverflowError)  # raised by the codec


def dead_letter(
    topic: str, record: object, exc: BaseException, headers: Mapping[str, str | bytes]
) -> DeadLetter:
    """The `DeadLetter` of a record that was never written (partition and offset -1); its value
    is the record as JSON text (NaN and Infinity spelled out), since Avro refused it."""
    fields = dataclasses.asdict(record) if dataclasses.is_dataclass(record) else {"record": repr(record)}  # type: ignore[arg-type]
    key = record_key(record)
    return DeadLetter(
        source_topic=topic,
        source_partition=-1,
        source_offset=-1,
        reason=str(exc),
        error_type=type(exc).__name__,
        key=key.encode() if isinstance(key, str) else key,
        value=json.dumps(fields, default=str).encode(),
        headers={k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in headers.items()},
    )


def refused_letter(topic: str, body: bytes, reason: str, error_type: str) -> DeadLetter:
    """The `DeadLetter` of a request refused at the edge (never an event): its body as sent, cut
    at `MAX_LETTER_BYTES`, keyed by its `session_id` when one can be read."""
    key: bytes | None = None
    try:
        session = json.loads(body).get("session_id")
        key = session.encode() if isinstance(session, str) and len(session) <= 256 else None
    except (ValueError, AttributeError, RecursionError):
        pass
    return DeadLetter(
        source_topic=topic,
        source_partition=-1,
        source_offset=-1,
        reason=reason[:2000],
        error_type=error_type,
        key=key,
        value=body[:MAX_LETTER_BYTES],
    )
