"""Garbage collection of claim-check blobs: a blob lives as long as a retained record of its topic
refers to it.

Blobs are stored under `<root>/<topic>/<sha256>.avro`. When retention (or compaction) deletes a
record from a topic, its blob becomes an orphan; so does the blob of a publish that never reached
the broker. `collect` reads every retained record of the topic, keeps the blobs some record still
refers to (claim checks, and claim checks inside dead letters) and deletes the others once they
are older than a grace period (a blob is written just before its record is acknowledged).
A topic with a record that cannot be read is left alone: nothing is deleted on a guess.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from stacx.producers.blobs import BlobInfo, FsspecBlobStore
from stacx.producers.kafka_log import kafka_logger
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import decode
from stacx.schemas.records import DeadLetter

__all__ = ["GcReport", "TopicUnreadable", "collect", "delete_topic_blobs", "referenced_in_topic"]

log = logging.getLogger(__name__)

_SMALL_BYTES = 64 * 1024
"""Claim checks and dead letters that hold one are small; larger values are inline records."""


class TopicUnreadable(Exception):
    """A record of the topic could not be decoded: which blobs it refers to is unknown."""


@dataclass(kw_only=True, slots=True)
class GcReport:
    """What `collect` did for one topic."""

    topic: str
    kept: int = 0
    young: int = 0
    """Unreferenced blobs within the grace period (kept)."""
    deleted: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    skipped: str | None = None
    """Why the topic was left alone."""


Decode = Callable[[bytes], Any]

_AVRO_MARKER = b"\xc3\x01"
"""Avro single-object encoding: what every STACX event starts with."""


def referenced_in_value(value: bytes | None, decode_value: Decode = decode) -> str | None:
    """The blob digest an event value refers to (a claim check, or one inside a dead letter).

    Values that are not Avro events (raw bytes kept in a dead letter) refer to nothing; an Avro
    event that cannot be decoded raises: it might be a claim check."""
    if not value or len(value) > _SMALL_BYTES or not value.startswith(_AVRO_MARKER):
        return None
    record = decode_value(value)
    if isinstance(record, DeadLetter):
        return referenced_in_value(record.value, decode_value)
    return record.sha256 if isinstance(record, ClaimCheck) else None


def referenced_in_topic(bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0) -> set[str]:
    """Digests of every blob a retained record of `topic` refers to (reads it to its end)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    from stacx.schemas import topics
    from stacx.schemas.catalogue import SchemaCatalogue
    from stacx.schemas.codec import Codec

    catalogue = SchemaCatalogue(
        SchemaCatalogue.Config(bootstrap_servers=bootstrap_servers, topic=topics.SCHEMAS, create_topic=False)
    )
    codec = Codec(resolver=catalogue.lookup)  # older writer schemas resolve through the catalogue
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"stacx-blob-gc-{uuid.uuid4().hex[:8]}",
            "logger": kafka_logger(),
            "enable.auto.commit": False,
        }
    )
    try:
        try:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
            error = meta.error if meta is not None else None
            if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return set()  # a deleted topic refers to nothing: its blobs are orphans
            if meta is None or meta.error is not None:
                raise TopicUnreadable(f"topic {topic!r}: {meta.error if meta else 'no metadata'}")
            partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
            marks = {p.partition: consumer.get_watermark_offsets(p, timeout=timeout_s) for p in partitions}
        except KafkaException as exc:
            raise TopicUnreadable(f"topic {topic!r}: {exc}") from exc
        consumer.assign(partitions)
        # a partition that retention emptied (start == end) has nothing left to refer to a blob
        wanted = {p: high for p, (low, high) in marks.items() if high > low}
        return _read_to_end(consumer, topic, wanted, codec.decode, timeout_s)
    finally:
        consumer.close()
        catalogue.close()


def _read_to_end(
    consumer: Any, topic: str, ends: dict[int, int], decode_value: Decode, timeout_s: float
) -> set[str]:
    digests: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while ends:
        msg = consumer.poll(1.0)
        if msg is None:
            if time.monotonic() > deadline:
                raise TopicUnreadable(f"{topic}: no record for {timeout_s:g} s before the end")
            continue
        deadline = time.monotonic() + timeout_s
        if msg.error() is not None:
            raise TopicUnreadable(f"{topic}: {msg.error()}")
        try:
            digest = referenced_in_value(msg.value(), decode_value)
        except Exception as exc:
            raise TopicUnreadable(f"{topic}[{msg.partition()}]@{msg.offset()}: {exc}") from exc
        if digest:
            digests.add(digest)
        if msg.offset() + 1 >= ends.get(msg.partition(), 0):
            ends.pop(msg.partition(), None)
    return digests


def collect(
    store: FsspecBlobStore,
    topics: Iterable[str],
    *,
    referenced: Callable[[str], set[str]],
    grace_s: float = 24 * 3600.0,
    dry_run: bool = False,
    now: float | None = None,
) -> list[GcReport]:
    """Delete the orphan blobs of each topic (`referenced(topic)` gives the digests in use)."""
    now = time.time() if now is None else now
    reports = []
    for topic in topics:
        report = GcReport(topic=topic)
        blobs = store.list_blobs(topic)
        if blobs:
            try:
                in_use = referenced(topic)
            except TopicUnreadable as exc:
                report.skipped = str(exc)
                reports.append(report)
                continue
            _sweep(store, blobs, in_use, report, grace_s=grace_s, now=now, dry_run=dry_run)
        reports.append(report)
    return reports


def _sweep(
    store: FsspecBlobStore,
    blobs: list[BlobInfo],
    in_use: set[str],
    report: GcReport,
    *,
    grace_s: float,
    now: float,
    dry_run: bool,
) -> None:
    for blob in blobs:
        if blob.sha256 in in_use:
            report.kept += 1
        elif grace_s > 0 and (blob.modified is None or now - blob.modified < grace_s):
            report.young += 1
        else:
            if not dry_run:
                store.delete(blob.url)
            report.deleted.append(blob.url)
            report.deleted_bytes += blob.size


def delete_topic_blobs(
    store: FsspecBlobStore, topics: Iterable[str], *, dry_run: bool = False
) -> list[GcReport]:
    """Delete every blob of `topics`, deleted topics (`stacx topics gc --run`): no record refers
    to them any more, whatever their age."""
    reports = []
    for topic in topics:
        report = GcReport(topic=topic)
        _sweep(store, store.list_blobs(topic), set(), report, grace_s=0.0, now=time.time(), dry_run=dry_run)
        reports.append(report)
    return reports
