"""Claim checks that go wrong: a blob that vanishes between the stages never stops the batch
agent, and dead letters keep the full original record (a copy under the DLQ's blob prefix)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from stacx.consumers.assembly import (
    AssemblerApp,
    AssemblyStats,
    BatchBuilder,
    BatchEncoder,
    GroupAssembler,
    MixturePlanner,
    ReadyGroup,
    SampleFilter,
    encode_group,
)
from stacx.consumers.assembly.testing import ListForwarder, RecordsReader, make_trajectory
from stacx.producers.blobs import FsspecBlobStore
from stacx.producers.errors import BlobStoreError
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import decode, encode
from stacx.schemas.records import DeadLetter, TrainingBatch, Trajectory


def _assembler(store: Path) -> tuple[AssemblerApp, ListForwarder]:
    forwarder = ListForwarder()
    config = AssemblerApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=1,
        grouping=GroupAssembler.Config(group_size=2),
        mixture=MixturePlanner.Config(batch_size=2),
        output=BatchEncoder.Config(blob_store_url=str(store)),
    )
    return AssemblerApp(config, forwarder=forwarder, gap_reader=RecordsReader()), forwarder


def _claim_checked(store: FsspecBlobStore, trajectory: Trajectory) -> tuple[bytes, str]:
    """The event a producer sends for a trajectory too large for the topic, and its blob URL."""
    url, digest = store.put(encode(trajectory), prefix="stacx.trajectories")
    claim = ClaimCheck(
        uri=url,
        size_bytes=1,
        sha256=digest,
        record_type="stacx.Trajectory",
        record_id=trajectory.trajectory_id,
    )
    return encode(claim), url


async def _groups(asm: AssemblerApp, out: ListForwarder, events: list[tuple[str, bytes]]) -> list[bytes]:
    async with asm.group_agent.test_context() as agent:
        for key, value in events:
            await agent.put(value, key=key.encode(), partition=0)
    return [o.value for o in out.on(asm.config.groups_topic)]


async def test_a_vanished_blob_dead_letters_its_group_and_the_agent_goes_on(tmp_path: Path) -> None:
    store = FsspecBlobStore(str(tmp_path))
    asm, out = _assembler(tmp_path)
    events, urls = [], []
    for group in ("a", "b", "c"):
        for index in range(2):
            value, url = _claim_checked(store, make_trajectory(group, index))
            events.append((group, value))
            urls.append(url)
    groups = await _groups(asm, out, events)
    assert len(groups) == 3
    store.delete(urls[0])  # a's first sample: gone between grouping and packing
    out.outputs.clear()
    async with asm.batch_agent.test_context() as agent:
        for payload in groups:
            await agent.put(payload, key=b"policy")  # the old agent raised here (BlobStoreError)
    outputs = out.outputs
    (batch_out,) = [o for o in outputs if o.topic == asm.config.batches_topic]
    assert set(decode(batch_out.value, TrainingBatch).group_ids) == {"b", "c"}
    letters = [decode(o.value, DeadLetter) for o in outputs if o.topic == asm.config.dlq_topic]
    assert [letter.key for letter in letters] == [b"a", b"a"]
    assert "claim-check blob lost" in letters[0].reason and "BlobStoreError" == letters[0].error_type
    # the other sample of the group is saved in full under the DLQ's prefix
    kept = decode(letters[1].value)
    assert isinstance(kept, ClaimCheck) and "/stacx.dlq/" in kept.uri
    assert decode(FsspecBlobStore.get(kept.uri, sha256=kept.sha256), Trajectory).sample_index == 1
    assert asm.stats.groups_rejected == 1 and len(asm.pool) == 0


def _ready(group_id: str, payloads: list[bytes]) -> bytes:
    group = ReadyGroup(
        group_id=group_id,
        model_name="policy",
        task_type="math",
        group_size=2,
        min_policy_version=0,
        payloads=payloads,
    )
    return encode_group(group)


def _builder() -> BatchBuilder:
    return BatchBuilder(
        BatchBuilder.Config(),
        planner=MixturePlanner(MixturePlanner.Config(batch_size=2)),
        sample_filter=SampleFilter(SampleFilter.Config(), {}),
        pool={},
        index={},
        packed={},
        stats=AssemblyStats(),
    )


def test_batch_builder_rejects_instead_of_raising(tmp_path: Path) -> None:
    """The old `_emit` raised BlobStoreError out of the Faust agent (the worker crashed)."""
    store = FsspecBlobStore(str(tmp_path))
    builder = _builder()
    claims = [_claim_checked(store, make_trajectory("g", i)) for i in range(2)]
    store.delete(claims[1][1])
    assert builder.on_group(_ready("g", [value for value, _ in claims]), now_ms=1) == []
    inline = [encode(make_trajectory("h", i)) for i in range(2)]
    assert builder.on_group(_ready("h", inline), now_ms=1) == []  # g and h fill a batch: g fails
    (rejected,) = builder.take_rejected()
    assert rejected.group.group_id == "g" and isinstance(rejected.error, BlobStoreError)
    (batch,) = builder.on_group(_ready("i", [encode(make_trajectory("i", j)) for j in range(2)]), now_ms=2)
    assert set(batch.group_ids) == {"h", "i"}
    assert builder.on_group(_ready("g", [value for value, _ in claims]), now_ms=3) == []  # redelivered


async def test_dead_letter_of_an_invalid_claim_checked_record_keeps_the_full_record(tmp_path: Path) -> None:
    store = FsspecBlobStore(str(tmp_path))
    asm, out = _assembler(tmp_path)
    bad = make_trajectory("g", 0)
    bad.loss_mask = bad.loss_mask[:-1]
    value, url = _claim_checked(store, bad)
    await _groups(asm, out, [("g", value)])
    (letter_out,) = out.on(asm.config.dlq_topic)
    letter = decode(letter_out.value, DeadLetter)
    assert "loss_mask" in letter.reason and "full record kept" in letter.reason
    store.delete(url)  # the trajectory blob is collected; the dead letter still has the record
    kept = decode(letter.value)
    assert isinstance(kept, ClaimCheck) and kept.uri != url
    assert list(decode(FsspecBlobStore.get(kept.uri, sha256=kept.sha256), Trajectory).loss_mask) == list(
        bad.loss_mask
    )


def test_inline_and_undecodable_values_are_kept_as_they_are(tmp_path: Path) -> None:
    from stacx.consumers.dead_letters import keep_original

    raw = encode(make_trajectory("g", 0))
    assert keep_original(raw, dlq_topic="stacx.dlq", store_url=str(tmp_path)) == (raw, "")
    assert keep_original(b"junk", dlq_topic="stacx.dlq", store_url=str(tmp_path)) == (b"junk", "")
    assert keep_original(None, dlq_topic="stacx.dlq") == (None, "")


async def test_dead_letters_of_a_group_that_cannot_be_packed_keep_each_trajectorys_trace(
    tmp_path: Path,
) -> None:
    store = FsspecBlobStore(str(tmp_path))
    asm, out = _assembler(tmp_path)
    parents: dict[tuple[str, int], str] = {}
    urls = []
    async with asm.group_agent.test_context() as agent:
        for g, group in enumerate(("a", "b", "c")):
            for index in range(2):
                parent = parents[group, index] = f"00-{g + 1:016x}{index + 1:016x}-{index + 1:016x}-01"
                value, url = _claim_checked(store, make_trajectory(group, index))
                urls.append(url)
                await agent.put(
                    value, key=group.encode(), partition=0, headers=[("traceparent", parent.encode())]
                )
    groups = out.on(asm.config.groups_topic)
    store.delete(urls[0])  # group a can no longer be packed
    out.outputs.clear()
    async with asm.batch_agent.test_context() as agent:
        for group_out in groups:
            await agent.put(group_out.value, key=b"policy", headers=group_out.headers)
    letters = out.on(asm.config.dlq_topic)
    assert len(letters) == 2
    for index, output in enumerate(letters):  # a's two samples, in sample order
        parent = parents["a", index]
        assert dict(output.headers or [])["traceparent"] == parent.encode()
        assert decode(output.value, DeadLetter).headers == {"traceparent": parent}


async def test_an_unwritable_blob_store_holds_the_batch_counts_nothing_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Batches above the claim-check threshold need the blob store. While it cannot be written
    the batch waits (nothing sent, nothing counted), one error line says why and the health
    signal is set; once the store takes blobs again the batch goes out."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's root should be")
    store = blocker / "blobs"
    asm, out = _assembler(store)
    asm.encoder.config.claim_check_threshold_bytes = 1024
    events = [(g, encode(make_trajectory(g, i, num_completion=200))) for g in ("a", "b") for i in range(2)]
    groups = await _groups(asm, out, events)
    out.outputs.clear()
    async with asm.batch_agent.test_context() as agent:
        await agent.put(groups[0], key=b"policy")
        second = asyncio.ensure_future(agent.put(groups[1], key=b"policy"))  # completes the batch
        await asyncio.sleep(2.5)  # two retries
        assert not second.done()
        assert out.on(asm.config.batches_topic) == [] and asm.stats.batches == 0
        assert asm.blob_store_problem is not None and "cannot write blob" in asm.blob_store_problem
        down = [r for r in caplog.records if "blob store" in r.getMessage() and r.levelname == "ERROR"]
        assert len(down) == 1 and down[0].exc_info is None
        assert len(asm.unwritten) == 1
        blocker.unlink()  # the store is writable again
        await asyncio.wait_for(second, timeout=10)
    (batch_out,) = out.on(asm.config.batches_topic)
    claim = decode(batch_out.value, ClaimCheck)
    assert FsspecBlobStore.get(claim.uri, sha256=claim.sha256)
    assert asm.stats.batches == 1 and asm.blob_store_problem is None and asm.unwritten == []
