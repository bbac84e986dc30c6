"""Groups a stopped worker batched before their `packed` marks reached the table.

Stage 2 writes a group's `packed` mark once the batch that took it is delivered, and its
groups-topic event is acknowledged after that mark. A worker killed in between leaves a batch on
the batches topic whose groups the next owner of the groups partition reads again (from the
committed offset) with no mark: packed again, into another batch with another id, they would be
trained twice. The batches topic is the truth: taking the groups partition, a worker reads the
batches written since the first groups event it will read again and marks their groups packed.

Each batch names its groups in a header (`GROUP_IDS_HEADER`), so that read never fetches a
claim-checked batch's blob; a batch without it (written by an earlier version) is decoded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from stacx.consumers.assembly.claims import decode_resolved
from stacx.consumers.assembly.gaps import GapReader
from stacx.schemas.codec import Codec
from stacx.schemas.records import TrainingBatch

__all__ = ["GROUP_IDS_HEADER", "batched_since_committed", "group_ids_header"]

log = logging.getLogger(__name__)

GROUP_IDS_HEADER = "stacx-group-ids"
CLOCK_MARGIN_MS = 60_000
"""Batches written this long before the first groups event read again are read too (the
workers of a fleet stamp records with their own clocks)."""


def group_ids_header(group_ids: Sequence[str]) -> tuple[str, bytes]:
    """The header naming a batch's groups (a JSON list)."""
    return GROUP_IDS_HEADER, json.dumps(sorted(set(group_ids))).encode()


def batch_group_ids(record: Any, codec: Codec) -> list[str]:
    """The group ids of one record of the batches topic: its header, else its decoded batch."""
    for key, value in record.headers() or []:
        if key == GROUP_IDS_HEADER:
            return [str(g) for g in json.loads(value)]
    decoded = decode_resolved(record.value(), codec)
    return sorted(set(decoded.group_ids)) if isinstance(decoded, TrainingBatch) else []


def batched_since_committed(
    reader: GapReader, *, groups_topic: str, batches_topic: str, codec: Codec,
    margin_ms: int = CLOCK_MARGIN_MS,
) -> set[str]:
    """The groups in batches written since the first event of `groups_topic` (one partition)
    that its consumer group will read again; empty when it reads nothing again. Blocking."""
    start = reader.start_offset(groups_topic, 0)
    end = reader.end_offset(groups_topic, 0)
    first = reader.read(groups_topic, 0, range(start, min(end, start + 16))) if start < end else []
    if not first:
        return set()
    since = int(first[0].timestamp()[1]) - margin_ms
    found: set[str] = set()
    for record in reader.records_since(batches_topic, since):
        if not record.value():
            continue
        try:
            found.update(batch_group_ids(record, codec))
        except Exception as exc:  # a record that is no batch: it marks nothing
            where = (batches_topic, record.partition(), record.offset())
            log.warning("%s[%s]@%s names no groups: %s", *where, exc)
    return found
