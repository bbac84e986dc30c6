"""Exceptions of the batch assembler: one root, `AssemblyError`."""

from __future__ import annotations

__all__ = [
    "AssemblyConfigError",
    "AssemblyError",
    "BrokerUnavailableError",
    "InvalidTrajectoryError",
    "OutputTopicMissing",
]


class AssemblyError(Exception):
    """Root of every error the assembler raises."""

    retriable: bool = False
    """True where retrying the same operation may succeed."""


class AssemblyConfigError(AssemblyError, ValueError):
    """A configuration value is invalid; the message names the field and the fix."""


class InvalidTrajectoryError(AssemblyError):
    """A decoded trajectory cannot be packed (inconsistent token arrays, missing ids)."""


class BrokerUnavailableError(AssemblyError):
    """Kafka did not answer, or answered with a transient error (a broker restarting, a
    partition changing leader): the same request succeeds once the cluster settles."""

    retriable = True


class OutputTopicMissing(AssemblyError):
    """A topic the assembler writes to does not exist (deleted under a running worker)."""

    retriable = True

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist (deleted?)")
        self.topic = topic
