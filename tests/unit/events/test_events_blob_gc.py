"""Blob garbage collection without a broker: what is kept, what goes, and when nothing is touched."""

from __future__ import annotations

import os
import time
from pathlib import Path

from stacx.consumers.blob_gc import TopicUnreadable, collect, referenced_in_value
from stacx.producers.blobs import FsspecBlobStore
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import encode
from stacx.schemas.records import DeadLetter

DAY = 24 * 3600.0


def _age(store: FsspecBlobStore, url: str, seconds: float) -> None:
    path = url.removeprefix("file://")
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_orphans_older_than_the_grace_period_are_deleted(tmp_path: Path) -> None:
    store = FsspecBlobStore(str(tmp_path))
    used, _ = store.put(b"in use", prefix="stacx.trajectories")
    old, _ = store.put(b"orphan", prefix="stacx.trajectories")
    young, _ = store.put(b"in flight", prefix="stacx.trajectories")
    for url in (used, old):
        _age(store, url, 2 * DAY)
    in_use = {used.rsplit("/", 1)[-1].removesuffix(".avro")}
    (report,) = collect(store, ["stacx.trajectories"], referenced=lambda topic: in_use, grace_s=DAY)
    assert report.deleted == [old] and report.kept == 1 and report.young == 1
    assert {b.url for b in store.list_blobs("stacx.trajectories")} == {used, young}


def test_dry_run_and_unreadable_topics_delete_nothing(tmp_path: Path) -> None:
    store = FsspecBlobStore(str(tmp_path))
    old, _ = store.put(b"orphan", prefix="t")
    _age(store, old, 2 * DAY)
    (dry,) = collect(store, ["t"], referenced=lambda topic: set(), grace_s=DAY, dry_run=True)
    assert dry.deleted == [old] and len(store.list_blobs("t")) == 1

    def unreadable(topic: str) -> set[str]:
        raise TopicUnreadable("t[0]@3: unknown writer schema")

    (skipped,) = collect(store, ["t"], referenced=unreadable, grace_s=DAY)
    assert skipped.skipped and skipped.deleted == [] and len(store.list_blobs("t")) == 1


def test_claim_checks_are_found_also_inside_dead_letters() -> None:
    claim = ClaimCheck(uri="file:///x/abc.avro", size_bytes=3, sha256="abc", record_type="stacx.Trajectory")
    assert referenced_in_value(encode(claim)) == "abc"
    letter = DeadLetter(
        source_topic="t", source_partition=0, source_offset=1, reason="r", error_type="E", value=encode(claim)
    )
    assert referenced_in_value(encode(letter)) == "abc"
    garbage = DeadLetter(
        source_topic="t", source_partition=0, source_offset=1, reason="r", error_type="E", value=b"junk"
    )
    assert referenced_in_value(encode(garbage)) is None
    assert referenced_in_value(b"not avro at all") is None
