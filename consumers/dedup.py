"""Drop events already seen, by record id (trajectory id, batch id, ...): ids are deterministic."""

from __future__ import annotations

from collections import OrderedDict

from stacx.schemas.identity import record_id

__all__ = ["Deduplicator"]


class Deduplicator:
    """Remembers the last `capacity` record ids; `is_duplicate` says whether one was seen before."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        if capacity <= 0:
            raise ValueError(f"Deduplicator capacity={capacity}: use a positive number of ids")
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.num_duplicates = 0
        """How many duplicates were recognised so far."""

    def is_duplicate(self, record: object) -> bool:
        """True if `record` (a record or anything with `.value`) has an id seen before; marks it seen."""
        value = getattr(record, "value", record)
        return self.seen(record_id(value))

    def seen(self, rid: str) -> bool:
        """True if `rid` was seen before; marks it seen (an empty id is never a duplicate)."""
        if not rid:
            return False
        if rid in self._seen:
            self._seen.move_to_end(rid)
            self.num_duplicates += 1
            return True
        self._seen[rid] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return False

    def __len__(self) -> int:
        return len(self._seen)
