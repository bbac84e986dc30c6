"""The seams of `producers`: what a publisher and a claim-check blob store must offer."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Protocol

from stacx.producers.event_producer import Delivery

__all__ = ["BlobStore", "Publisher"]


class Publisher(Protocol):
    """Publishes typed records; EventProducer on Kafka, InMemoryPublisher in unit tests."""

    def publish(
        self,
        topic: str,
        record: object,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
    ) -> Future[Delivery]: ...

    def flush(self, timeout_s: float | None = None) -> int: ...

    def close(self, timeout_s: float | None = None) -> None: ...


class BlobStore(Protocol):
    """Stores claim-checked payloads; returns (url, sha256 hex)."""

    def put(self, data: bytes, *, prefix: str = "") -> tuple[str, str]: ...
