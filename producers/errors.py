"""Exceptions of the `producers` package: one root, `ProducerError`."""

from __future__ import annotations

__all__ = ["BlobStoreError", "DeliveryError", "ProducerClosedError", "ProducerError"]


class ProducerError(Exception):
    """Root of every error raised by `producers`."""

    retriable = False


class DeliveryError(ProducerError):
    """The broker did not acknowledge a record (set on the future `publish()` returned)."""

    def __init__(self, topic: str, record_id: str, reason: str, *, retriable: bool = False) -> None:
        self.topic = topic
        self.record_id = record_id
        self.reason = reason
        self.retriable = retriable
        super().__init__(f"record {record_id or '(no id)'} to {topic!r} not delivered: {reason}")


class ProducerClosedError(ProducerError):
    """`publish()` after `close()`."""


class BlobStoreError(ProducerError):
    """A claim-check blob could not be written or read."""

    retriable = True
