"""In-memory publisher for unit tests: same API as EventProducer, no broker.

Every record goes through the real codec (so an unencodable record fails here too) and is kept
per topic; `InMemoryConsumer` (stacx.consumers.memory) reads them back.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from stacx.producers.errors import ProducerClosedError
from stacx.producers.event_producer import Delivery
from stacx.schemas.codec import Codec, default_codec
from stacx.schemas.identity import record_id, record_key
from stacx.schemas.records import now_ms
from stacx.schemas.validation import validate

__all__ = ["InMemoryPublisher", "StoredEvent"]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One published event as a broker would keep it."""

    topic: str
    offset: int
    key: str | bytes | None
    value: bytes
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = field(default_factory=now_ms)


class InMemoryPublisher:
    """A Publisher keeping encoded events in memory, one partition per topic."""

    def __init__(self, codec: Codec | None = None, *, validate_records: bool = True) -> None:
        self.codec = codec or default_codec()
        self.validate_records = validate_records
        """Refuse invalid records as EventProducer does (`EventProducer.Config.validate`)."""
        self.topics: dict[str, list[StoredEvent]] = {}
        self._closed = False
        self._lock = threading.Lock()

    def publish(
        self,
        topic: str,
        record: object,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
    ) -> Future[Delivery]:
        """Encode and store `record`; the returned future is already resolved."""
        if self.validate_records:
            validate(record)
        value = self.codec.encode(record)
        return self.publish_bytes(
            topic,
            value,
            key=record_key(record) if key is None else key,
            headers=headers,
            record_id=record_id(record),
        )

    def publish_bytes(
        self,
        topic: str,
        value: bytes,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        record_id: str = "",
    ) -> Future[Delivery]:
        """Store an already encoded value."""
        if self._closed:
            raise ProducerClosedError("publish() on a closed InMemoryPublisher")
        encoded = {k: v.encode() if isinstance(v, str) else v for k, v in (headers or {}).items()}
        with self._lock:
            log = self.topics.setdefault(topic, [])
            event = StoredEvent(topic, len(log), key, value, encoded)
            log.append(event)
        future: Future[Delivery] = Future()
        future.set_result(Delivery(topic, 0, event.offset, event.timestamp_ms, record_id))
        return future

    def records(self, topic: str) -> list[object]:
        """Decoded records of `topic`, in publish order."""
        return [self.codec.decode(e.value) for e in self.topics.get(topic, [])]

    def flush(self, timeout_s: float | None = None) -> int:
        return 0

    def close(self, timeout_s: float | None = None) -> None:
        self._closed = True

    def __enter__(self) -> InMemoryPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
