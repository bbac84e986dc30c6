"""Dead letters that keep the full original record, also when it travelled by claim check.

A claim-checked event is only a pointer: dead-lettering the pointer would lose the record once
its blob is collected (`stacx topics gc`) or if it vanished. `keep_original` copies the blob into
the dead-letter topic's own prefix of the blob store (its lifecycle then follows the DLQ) and
puts a claim check of the copy in the dead letter. A blob that is already gone cannot be saved:
the note says so, and the claim check is kept for the record.
"""

from __future__ import annotations

import dataclasses
import logging

from stacx.producers.blobs import FsspecBlobStore
from stacx.producers.errors import BlobStoreError
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import decode, encode

__all__ = ["keep_original"]

log = logging.getLogger(__name__)


def keep_original(
    value: bytes | None, *, dlq_topic: str, store_url: str | None = None
) -> tuple[bytes | None, str]:
    """(the value to dead-letter in place of `value`, a note to append to the reason)."""
    if not value:
        return value, ""
    try:
        record = decode(value)
    except Exception:  # undecodable bytes are the original themselves
        return value, ""
    if not isinstance(record, ClaimCheck):
        return value, ""
    try:
        url, digest = FsspecBlobStore(store_url).copy(record.uri, prefix=dlq_topic, sha256=record.sha256)
    except BlobStoreError as exc:
        log.error("dead letter of %s: its claim-check blob is lost (%s)", record.record_id or record.uri, exc)
        return value, f" [claim-check blob lost: {exc}]"
    return encode(dataclasses.replace(record, uri=url, sha256=digest)), f" [full record kept at {url}]"
