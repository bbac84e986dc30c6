"""`stacx topics gc` against the real broker: blobs of retained claim checks stay, orphans go."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from events_kafka_helpers import trajectory

from stacx.infra.cli import main
from stacx.producers import EventProducer
from stacx.producers.blobs import FsspecBlobStore


def _tokens(n: int) -> dict[str, list[int] | list[float]]:
    """A valid token layout of `n` tokens (the producer checks that the arrays agree)."""
    return {"token_ids": list(range(n)), "loss_mask": [1] * n, "logprobs": [-0.5] * n}


def test_gc_keeps_referenced_blobs_and_removes_orphans(
    kafka_bootstrap: str, fresh_topic: Any, tmp_path: Path, capsys: Any
) -> None:
    topic = fresh_topic("blobgc")
    config = EventProducer.Config(
        bootstrap_servers=kafka_bootstrap, claim_check_threshold_bytes=64, blob_store_url=str(tmp_path)
    )
    with EventProducer(config) as producer:
        for i in range(3):
            producer.publish(topic, trajectory(i, **_tokens(200))).result(timeout=30)
    store = FsspecBlobStore(str(tmp_path))
    referenced = {b.url for b in store.list_blobs(topic)}
    assert len(referenced) == 3
    orphan, _ = store.put(b"a record whose publish failed", prefix=topic)
    then = time.time() - 7200
    for blob in store.list_blobs(topic):
        os.utime(blob.url.removeprefix("file://"), (then, then))
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["topics", "gc", topic, "--store", str(tmp_path), "--bootstrap", kafka_bootstrap, "--grace", "1"]
        )
    out = capsys.readouterr().out
    assert exit_info.value.code == 0, out
    assert {b.url for b in store.list_blobs(topic)} == referenced
    assert "deleted 1 orphan blobs" in out and "kept 3 in use" in out
