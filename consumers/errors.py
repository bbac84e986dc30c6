"""Exceptions of the `consumers` package: one root, `ConsumerError`."""

from __future__ import annotations

__all__ = ["ConsumerClosedError", "ConsumerError", "UnexpectedRecordError"]


class ConsumerError(Exception):
    """Root of every error raised by `consumers`."""

    retriable = False

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class ConsumerClosedError(ConsumerError):
    """An operation on a closed EventConsumer."""


class UnexpectedRecordError(ConsumerError):
    """A valid event of a record type this consumer does not read (e.g. a `TaskSample` on the
    batches topic); it is dead-lettered like an undecodable one."""
