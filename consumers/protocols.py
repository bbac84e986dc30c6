"""The seams of `consumers`: what an event source must offer (EventConsumer, InMemoryConsumer)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from stacx.consumers.event_consumer import ConsumedEvent

__all__ = ["EventSource"]


class EventSource(Protocol):
    """Typed events with manual commits."""

    def poll(self, timeout: float = 1.0) -> ConsumedEvent | None: ...

    def consume(self, max_records: int = 500, timeout: float = 1.0) -> list[ConsumedEvent]: ...

    def commit(self, events: ConsumedEvent | Iterable[ConsumedEvent] | None = None) -> None: ...

    def close(self) -> None: ...
