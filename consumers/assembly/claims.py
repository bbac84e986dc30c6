"""Claim checks at the assembler's edges: large trajectories in, large batches out.

Producers replace records above a topic's size limit with a `ClaimCheck` (a blob-store URL).
The assembler keeps the event bytes as they arrived (small for claim-checked samples) in its
state and resolves them whenever it needs the record; batches above the limit go out the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stacx.consumers.assembly.errors import AssemblyConfigError, InvalidTrajectoryError
from stacx.producers.blobs import FsspecBlobStore, default_blob_url
from stacx.schemas import topics
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import Codec, default_codec
from stacx.schemas.records import TrainingBatch, Trajectory

__all__ = ["BatchEncoder", "decode_resolved", "decode_trajectory"]


def decode_resolved(payload: bytes, codec: Codec) -> Any:
    """Decode an event, fetching it from the blob store if it is a claim check."""
    record = codec.decode(payload)
    if isinstance(record, ClaimCheck):
        record = codec.decode(FsspecBlobStore.get(record.uri, sha256=record.sha256))
    return record


def decode_trajectory(payload: bytes, codec: Codec | None = None) -> Trajectory:
    """Decode a trajectory event, fetching it from the blob store if it is a claim check.

    `codec` resolves writer schemas (the assembler passes its catalogue codec, so a compatible
    newer `Trajectory` decodes); default: the built-in schemas only."""
    record = decode_resolved(payload, codec or default_codec())
    if not isinstance(record, Trajectory):
        raise InvalidTrajectoryError(
            f"expected a Trajectory event, got a {type(record).__name__}: it was published to the wrong topic"
        )
    return record


class BatchEncoder:
    """Encodes batches; ones larger than the threshold go to the blob store behind a claim check."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        claim_check_threshold_bytes: int = topics.BATCHES_MAX_MESSAGE_BYTES - 64 * 1024
        """Encoded batches above this size are stored as blobs and sent as a `ClaimCheck`."""
        blob_store_url: str = field(default_factory=default_blob_url)
        """fsspec root of the claim-check blob store (shared with the trainer)."""

        def __post_init__(self) -> None:
            if self.claim_check_threshold_bytes < 1024:
                raise AssemblyConfigError(
                    "output.claim_check_threshold_bytes must be >= 1024, "
                    f"got {self.claim_check_threshold_bytes}"
                )

    def __init__(self, config: Config, codec: Codec | None = None, *, topic: str = topics.BATCHES) -> None:
        self.config = config
        self.codec = codec or default_codec()
        self.topic = topic
        """The batches topic: blobs go under its prefix, so `stacx topics gc` can match them."""
        self._blobs: FsspecBlobStore | None = None

    def encode(self, batch: TrainingBatch) -> bytes:
        value = self.codec.encode(batch)
        if len(value) <= self.config.claim_check_threshold_bytes:
            return value
        if self._blobs is None:
            self._blobs = FsspecBlobStore(self.config.blob_store_url)
        url, digest = self._blobs.put(value, prefix=self.topic)
        claim = ClaimCheck(
            uri=url,
            size_bytes=len(value),
            sha256=digest,
            record_type=self.codec.local_schema(TrainingBatch).name,
            record_id=batch.batch_id,
        )
        return self.codec.encode(claim)
