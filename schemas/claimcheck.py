"""The claim-check record: what travels on a topic in place of a record too large for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from stacx.schemas.records import now_ms

__all__ = ["ClaimCheck"]


@dataclass(kw_only=True, slots=True)
class ClaimCheck:
    """Reference to an encoded record stored in a blob store (readers fetch it transparently)."""

    uri: str
    """fsspec URL of the blob holding the record's full single-object encoding."""
    size_bytes: int
    """Size of the blob in bytes."""
    sha256: str
    """Hex SHA-256 of the blob, checked on read."""
    record_type: str
    """Avro full name of the referenced record (e.g. `stacx.Trajectory`)."""
    record_id: str = ""
    """Id of the referenced record, for logs and deduplication."""
    created_at_ms: int = field(default_factory=now_ms)
    """When the claim check was written."""
