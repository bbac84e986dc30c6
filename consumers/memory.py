"""In-memory event source for unit tests: reads what an InMemoryPublisher stored."""

from __future__ import annotations

from collections.abc import Iterable

from stacx.consumers.errors import ConsumerClosedError
from stacx.consumers.event_consumer import ConsumedEvent
from stacx.producers.memory import InMemoryPublisher
from stacx.schemas.validation import validate

__all__ = ["InMemoryConsumer"]


class InMemoryConsumer:
    """An EventSource over an InMemoryPublisher's topics (decoded and validated like EventConsumer).

    Undecodable or invalid events are counted in `num_dead_letters` and skipped.
    """

    def __init__(self, publisher: InMemoryPublisher, topics: Iterable[str]) -> None:
        self.publisher = publisher
        self.topics = list(topics)
        self.positions = dict.fromkeys(self.topics, 0)
        """Next offset to read, per topic."""
        self.committed = dict.fromkeys(self.topics, 0)
        """Committed offset (next to read after a restart), per topic."""
        self.num_dead_letters = 0
        self._closed = False

    def poll(self, timeout: float = 1.0) -> ConsumedEvent | None:
        events = self.consume(1, timeout)
        return events[0] if events else None

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[ConsumedEvent]:
        if self._closed:
            raise ConsumerClosedError("InMemoryConsumer is closed")
        out: list[ConsumedEvent] = []
        for topic in self.topics:
            log = self.publisher.topics.get(topic, [])
            while self.positions[topic] < len(log) and len(out) < max_records:
                stored = log[self.positions[topic]]
                self.positions[topic] += 1
                try:
                    record = self.publisher.codec.decode(stored.value)
                    validate(record)
                except Exception:  # mirrors EventConsumer: dead-letter and go on
                    self.num_dead_letters += 1
                    continue
                key = stored.key.decode() if isinstance(stored.key, bytes) else stored.key
                out.append(
                    ConsumedEvent(
                        record, key, topic, 0, stored.offset, stored.timestamp_ms, dict(stored.headers)
                    )
                )
        return out

    def commit(self, events: ConsumedEvent | Iterable[ConsumedEvent] | None = None) -> None:
        if events is None:
            self.committed.update(self.positions)
            return
        for e in [events] if isinstance(events, ConsumedEvent) else events:
            self.committed[e.topic] = max(self.committed[e.topic], e.offset + 1)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self.positions[topic] = offset

    def close(self) -> None:
        self._closed = True
