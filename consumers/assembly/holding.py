"""Open groups live in worker memory; the trajectories topic is their changelog.

An input event of a group that is still open is not acknowledged, so the worker's committed
offset never passes the first event of the oldest open group of a partition. After a crash or a
rebalance, the worker that gets the partition reads again from the committed offset and rebuilds
its open groups from the redelivered events; closed groups are remembered in the `groups` table
(one record per group), so their redelivered samples are duplicates or late, as always.

`HeldAcks` hands acknowledgements to Faust in offset order per partition: Faust commits the
highest offset of the first run of consecutive acknowledged offsets, and its gap check lets one
unacknowledged offset slip through (an ack of offsets 11, 12 with offset 10 held commits 13), so
an event is acknowledged only once every earlier event of its partition is.

`GroupRecords` is the `groups` mapping of `GroupAssembler` in the worker: open groups in memory,
a closed group in memory until its output is delivered, then in the `groups` table. A crash before
that delivery rebuilds and re-emits the group (stage 2 drops the second copy); its record never
says "closed" for a group whose output may be lost.

Stage 2 does the same with the single-partition groups topic: the pool is in memory
(`TrackedPool`), a group's event is held while the group is pooled, and its `packed` mark
(`PendingMarks`) reaches the table once the batch that took it is delivered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stacx.consumers.assembly.protocols import StateTable

__all__ = ["GroupRecords", "HeldAcks", "PendingMarks", "TrackedPool"]

E = TypeVar("E")
GroupRecord = dict[str, Any]


@dataclass(slots=True, eq=False)
class _Entry(Generic[E]):
    source: Hashable
    """The topic partition the event came from."""
    event: E
    done: bool = False


class HeldAcks(Generic[E]):
    """Input events in arrival order per topic partition; an event is ready to acknowledge once it
    and every earlier event of its partition are done (processed, or their group handed on)."""

    def __init__(self) -> None:
        self._queues: dict[Hashable, deque[_Entry[E]]] = {}
        self._held: dict[str, list[_Entry[E]]] = {}

    def arrived(self, source: Hashable, event: E) -> _Entry[E]:
        """Track `event` of `source` (a topic partition); not done yet."""
        entry = _Entry(source, event)
        self._queues.setdefault(source, deque()).append(entry)
        return entry

    @staticmethod
    def done(entry: _Entry[E]) -> None:
        """`entry` needs nothing more (a tick, a duplicate, a dead letter)."""
        entry.done = True

    def hold(self, group_id: str, entry: _Entry[E]) -> None:
        """`entry` is a sample of the open group `group_id`: done when the group is released."""
        self._held.setdefault(group_id, []).append(entry)

    def release(self, group_id: str) -> None:
        """The group has been handed on: its events are done."""
        for entry in self._held.pop(group_id, []):
            entry.done = True

    def ready(self) -> list[E]:
        """Take the events that can be acknowledged now, in offset order per partition."""
        events: list[E] = []
        for queue in self._queues.values():
            while queue and queue[0].done:
                events.append(queue.popleft().event)
        return events

    def drop(self, sources: Iterable[Hashable]) -> None:
        """Forget the events of revoked partitions without acknowledging them."""
        gone = set(sources)
        for source in gone:
            self._queues.pop(source, None)
        for group_id in [g for g, held in self._held.items() if held and held[0].source in gone]:
            del self._held[group_id]

    @property
    def num_waiting(self) -> int:
        """Events tracked and not yet acknowledged."""
        return sum(len(q) for q in self._queues.values())

    def is_held(self, group_id: str) -> bool:
        return group_id in self._held


class GroupRecords(MutableMapping[str, GroupRecord]):
    """Group records: open and just-closed ones in memory, delivered ones in `closed` (a table)."""

    def __init__(self, closed: StateTable[GroupRecord]) -> None:
        self.closed = closed
        self.open: dict[str, GroupRecord] = {}
        self.closing: dict[str, GroupRecord] = {}
        """Closed groups whose output is not delivered yet."""
        self._just_closed: list[str] = []

    def __getitem__(self, key: str) -> GroupRecord:
        record = self.open.get(key)
        if record is None:
            record = self.closing.get(key)
        if record is None:
            record = self.closed[key]
        return record

    def __setitem__(self, key: str, record: GroupRecord) -> None:
        if not record["closed_ms"]:
            self.open[key] = record
        elif key in self.open or key not in self.closed:
            self.open.pop(key, None)
            self.closing[key] = record
            self._just_closed.append(key)
        else:
            self.closed[key] = record

    def __delitem__(self, key: str) -> None:
        found = self.open.pop(key, None) or self.closing.pop(key, None)
        if found is None:
            del self.closed[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.open
        yield from self.closing
        yield from (k for k in self.closed if k not in self.closing and k not in self.open)

    def __len__(self) -> int:
        return len(self.open) + len(self.closing) + len(self.closed)

    def take_just_closed(self) -> list[str]:
        """Groups closed since the last call."""
        closed, self._just_closed = self._just_closed, []
        return closed

    def confirm(self, group_id: str) -> None:
        """The group's output is delivered: remember it as closed in the table (one write)."""
        record = self.closing.pop(group_id, None)
        if record is not None:
            self.closed[group_id] = record

    def drop_partitions(self, partitions: set[int]) -> dict[str, GroupRecord]:
        """Forget the open and closing groups of revoked partitions; returns them by group id."""
        dropped: dict[str, GroupRecord] = {}
        for records in (self.open, self.closing):
            for key in [k for k, r in records.items() if r["partition"] in partitions]:
                dropped[key] = records.pop(key)
        return dropped


class TrackedPool(dict[str, bytes]):
    """Stage 2's pool in memory (the groups topic is its changelog): notes which groups entered
    and left it, so their events are held while they are pooled."""

    def __init__(self) -> None:
        super().__init__()
        self._entered: list[str] = []
        self._left: list[str] = []

    def __setitem__(self, key: str, value: bytes) -> None:
        super().__setitem__(key, value)
        self._entered.append(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._left.append(key)

    def take_changes(self) -> tuple[list[str], list[str]]:
        """(groups that entered, groups that left) since the last call."""
        changes = (self._entered, self._left)
        self._entered, self._left = [], []
        return changes

    def clear(self) -> None:
        super().clear()
        self._entered, self._left = [], []


class PendingMarks(MutableMapping[str, Any]):
    """Marks (`packed`: group id -> when) kept in memory until the batch they stand for is
    delivered, then written to `table`: a crash before that delivery packs the groups again."""

    def __init__(self, table: StateTable[Any]) -> None:
        self.table = table
        self.pending: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self.pending:
            return self.pending[key]
        return self.table[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.pending[key] = value

    def __delitem__(self, key: str) -> None:
        if key in self.pending:
            del self.pending[key]
        else:
            del self.table[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.pending
        yield from (k for k in self.table if k not in self.pending)

    def __len__(self) -> int:
        return len(self.pending) + sum(1 for k in self.table if k not in self.pending)

    def found_batched(self, keys: Iterable[str], at: Any) -> int:
        """Groups found in delivered batches with no mark (their worker stopped before writing
        it): marked in memory, never written (their events are acknowledged as duplicates, so
        they are not read again). How many were unmarked."""
        fresh = [key for key in keys if key not in self]
        for key in fresh:
            self.pending[key] = at
        return len(fresh)

    def confirm(self, keys: Iterable[str]) -> None:
        """The batch of these groups is delivered: write their marks (one record each)."""
        for key in keys:
            if key in self.pending:
                self.table[key] = self.pending.pop(key)
