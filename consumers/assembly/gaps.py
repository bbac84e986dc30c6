"""Every input event reaches the agents once, in offset order, even when Faust drops one.

The assembler holds acknowledgements while a group is open (`holding`), so an event that never
reaches its agent is not merely late: once a later event of its partition is acknowledged, Faust
commits past it and it is lost. Faust can drop such an event around a rebalance: its recovery
resumes the partitions, seeks them to their committed offsets, and only then resumes the flow,
which empties the agents' queues (on a first assignment) or skips what is fetched meanwhile (on a
later one). An event fetched right after the seek falls in between: its read offset is already
past it, so it is never fetched again. Seen as a restarted worker missing the event at its
committed offset, about one restart in five on a loaded machine.

`OffsetGuard` knows, per partition, the next offset an agent must see: the committed offset when
the partition is assigned, then one past each event taken. An event past it means events were
dropped: `KafkaGapReader` reads them straight from Kafka, and the agent processes them first. An
event before it is a second delivery of one already taken (Faust re-reads from the committed
offset after a seek): it is skipped. Offsets with no record (transaction markers) are simply
not found by the reader.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from typing import Any, Protocol

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from consumers.assembly.errors import AssemblyError

__all__ = ["GapReader", "KafkaGapReader", "OffsetGuard"]


class GapReader(Protocol):
    """Where a partition's reading starts, and the records Faust did not deliver (Kafka in the
    worker, a dict in unit tests). Blocking: the agents call it in a thread."""

    def start_offset(self, topic: str, partition: int) -> int:
        """The offset the consumer group reads `topic[partition]` from after an assignment."""
        ...

    def read(self, topic: str, partition: int, offsets: range) -> list[Any]:
        """The records at `offsets` (confluent-kafka `Message`s: `.offset()`, `.value()`...)."""
        ...

    def close(self) -> None: ...


class OffsetGuard:
    """The next offset each partition's agent must see."""

    def __init__(self) -> None:
        self._next: dict[Hashable, int] = {}

    def knows(self, source: Hashable) -> bool:
        """Whether `source` (a topic partition) has a starting offset since it was assigned."""
        return source in self._next

    def start(self, source: Hashable, offset: int) -> None:
        """`source` was assigned and reads from `offset` (its committed offset)."""
        self._next[source] = offset

    def admit(self, source: Hashable, offset: int) -> range | None:
        """An event of `source` at `offset` arrived. None: it was taken before (skip it);
        otherwise the offsets that should have come first (empty when none did not) — the event
        is taken."""
        expected = self._next.get(source, offset)
        if offset < expected:
            return None
        self._next[source] = offset + 1
        return range(expected, offset)

    def forget(self, sources: set[Any]) -> None:
        """Revoked partitions: their next owner starts from the committed offset again."""
        for source in sources:
            self._next.pop(source, None)


class KafkaGapReader:
    """Reads a consumer group's committed offsets and ranges of records straight from Kafka,
    with a consumer that never joins the group (blocking calls: run them in a thread)."""

    def __init__(self, bootstrap_servers: str, group_id: str, *, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._group = Consumer(
            {"bootstrap.servers": bootstrap_servers, "group.id": group_id, "enable.auto.commit": False}
        )
        self._reader = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"{group_id}-gaps-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",  # as the Faust consumer reads
            }
        )

    def start_offset(self, topic: str, partition: int) -> int:
        """Where the group reads `topic[partition]` from: its committed offset, or the earliest
        retained one when nothing is committed or the committed one was deleted."""
        where = TopicPartition(topic, partition)
        try:
            (committed,) = self._group.committed([where], timeout=self.timeout_s)
            low, _ = self._group.get_watermark_offsets(where, timeout=self.timeout_s)
        except KafkaException as exc:
            raise AssemblyError(f"cannot read the committed offset of {topic}[{partition}]: {exc}") from exc
        if committed.offset == OFFSET_INVALID or committed.offset < low:
            return int(low)
        return int(committed.offset)

    def read(self, topic: str, partition: int, offsets: range) -> list[Any]:
        """The records of `topic[partition]` at `offsets` (confluent-kafka messages, in order)."""
        self._reader.assign([TopicPartition(topic, partition, offsets.start)])
        found: list[Any] = []
        try:
            while True:
                message = self._reader.poll(self.timeout_s)
                if message is None:
                    raise AssemblyError(
                        f"records {offsets.start}..{offsets.stop - 1} of {topic}[{partition}] did not "
                        f"arrive within {self.timeout_s:.0f}s"
                    )
                if message.error() is not None:
                    raise AssemblyError(f"cannot read {topic}[{partition}]: {message.error()}")
                offset = message.offset()
                if offset is not None and offset >= offsets.stop:
                    return found
                found.append(message)
        finally:
            self._reader.unassign()

    def close(self) -> None:
        self._group.close()
        self._reader.close()
