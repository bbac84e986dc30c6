"""Exceptions of the `consumers` package: one root, `ConsumerError`."""

from __future__ import annotations

__all__ = ["CommitRefusedError", "ConsumerClosedError", "ConsumerError", "UnexpectedRecordError"]


class ConsumerError(Exception):
    """Root of every error raised by `consumers`."""

    retriable = False

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class ConsumerClosedError(ConsumerError):
    """An operation on a closed EventConsumer."""


class CommitRefusedError(ConsumerError):
    """The group moved on since the events were read (this member was evicted, e.g. its session
    timed out while the broker restarted, or a rebalance is under way): the broker refused the
    commit. Nothing is lost: the events are redelivered to whoever owns the partition now,
    this member included once it has rejoined."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class UnexpectedRecordError(ConsumerError):
    """A valid event of a record type this consumer does not read (e.g. a `TaskSample` on the
    batches topic); it is dead-lettered like an undecodable one."""
