"""The seams of the assembler: where state lives and where batches go.

Faust tables satisfy `StateTable` (they are mutable mappings whose writes go to a changelog);
plain dicts satisfy it in unit tests.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

__all__ = ["Forwarder", "LatestVersions", "Output", "StateTable"]

V = TypeVar("V")

StateTable: TypeAlias = MutableMapping[str, V]
"""Key/value state: a Faust table in the worker, a dict in unit tests.

Values must be reassigned (not mutated in place) for a change to reach the table's changelog.
"""

LatestVersions: TypeAlias = Mapping[str, int]
"""Newest published policy version per model name (a Faust global table in the worker)."""


@dataclass(frozen=True, slots=True)
class Output:
    """One record an agent wants published."""

    topic: str
    """Destination topic name."""
    key: bytes | None
    """Kafka key (raw bytes)."""
    value: bytes
    """Encoded value (raw bytes)."""
    headers: list[tuple[str, bytes]] | None = None
    """Kafka headers (the trace context of a batch or a dead letter)."""


class Forwarder(Protocol):
    """Publishes agent outputs (Kafka in the worker, a list in unit tests)."""

    async def send(self, output: Output) -> Any:
        """Hand `output` on; returns its delivery (an `asyncio.Future` that completes once Kafka
        has the record), or None where there is nothing to wait for."""
        ...
