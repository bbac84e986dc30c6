"""`ReadyGroup`: a closed prompt group on its way from grouping to packing.

It travels on the assembler's internal groups topic and sits in the mixture pool table as
bytes: a length-prefixed JSON header followed by the length-prefixed encoded trajectories
(kept exactly as they arrived, so nothing is re-encoded between the two stages).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

__all__ = ["ReadyGroup", "decode_group", "encode_group"]

_LEN = struct.Struct(">I")


@dataclass(kw_only=True, slots=True)
class ReadyGroup:
    """The trainable samples of one prompt group, ordered by sample index."""

    group_id: str
    """Group id (the Kafka key on the trajectories topic)."""
    model_name: str
    """Model whose policy produced the samples; batches never mix models."""
    task_type: str
    """Task type of the group, used by the task-aware mixture."""
    group_size: int
    """Expected samples per group (`n`)."""
    min_policy_version: int
    """Oldest policy version among the samples, for the packing-time staleness check."""
    payloads: list[bytes] = field(default_factory=list)
    """Encoded trajectories (Avro single-object bytes), ordered by sample index."""
    flagged_ids: list[str] = field(default_factory=list)
    """Failed trajectories kept under the `flag`/`mask` failure policies."""
    pad_to: int = 0
    """Pad the group to this many sequences when packing (0: no padding)."""
    closed_reason: str = "complete"
    """`complete` (n samples arrived) or `timeout`."""

    @property
    def num_sequences(self) -> int:
        return max(len(self.payloads), self.pad_to)


def encode_group(group: ReadyGroup) -> bytes:
    header = {
        "group_id": group.group_id,
        "model_name": group.model_name,
        "task_type": group.task_type,
        "group_size": group.group_size,
        "min_policy_version": group.min_policy_version,
        "flagged_ids": group.flagged_ids,
        "pad_to": group.pad_to,
        "closed_reason": group.closed_reason,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [_LEN.pack(len(head)), head, _LEN.pack(len(group.payloads))]
    for payload in group.payloads:
        parts.append(_LEN.pack(len(payload)))
        parts.append(payload)
    return b"".join(parts)


def decode_group(data: bytes) -> ReadyGroup:
    view = memoryview(data)
    (head_len,) = _LEN.unpack_from(view, 0)
    pos = _LEN.size
    header = json.loads(bytes(view[pos : pos + head_len]))
    pos += head_len
    (count,) = _LEN.unpack_from(view, pos)
    pos += _LEN.size
    payloads: list[bytes] = []
    for _ in range(count):
        (size,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        payloads.append(bytes(view[pos : pos + size]))
        pos += size
    return ReadyGroup(payloads=payloads, **header)
