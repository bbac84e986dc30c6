"""The Faust agents under `agent.test_context()` (in-memory channels, memory:// tables)."""

from __future__ import annotations

import io
import uuid
from typing import Any

import fastavro

from stacx.consumers.assembly import TICK_KEY, AssemblerApp, GroupAssembler, MixturePlanner
from stacx.consumers.assembly.packing import batch_id
from stacx.consumers.assembly.testing import ListForwarder, RecordsReader, make_trajectory
from stacx.schemas.codec import SINGLE_OBJECT_MARKER, Codec, SchemaInfo, decode, encode, load_schema
from stacx.schemas.records import DeadLetter, TrainingBatch, Trajectory, WeightVersion


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def _assembler(
    clock: FakeClock | None = None, codec: Codec | None = None, **grouping: Any
) -> tuple[AssemblerApp, ListForwarder]:
    forwarder = ListForwarder()
    config = AssemblerApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=2,
        grouping=GroupAssembler.Config(group_size=2, **grouping),
        mixture=MixturePlanner.Config(batch_size=2),
    )
    app = AssemblerApp(
        config,
        forwarder=forwarder,
        clock=clock or FakeClock(),
        codec=codec or Codec(),
        gap_reader=RecordsReader(),
    )
    return app, forwarder


async def _put_trajectory(agent: Any, traj: Trajectory, partition: int = 0) -> None:
    await agent.put(encode(traj), key=traj.group_id.encode(), partition=partition)


async def _put_on(agent: Any, topic: str, value: bytes, key: bytes, partition: int) -> None:
    """`agent.put` as if the message had arrived on `topic` (the test channel has no name)."""
    original = agent.to_message

    def on_topic(*args: Any, **kwargs: Any) -> Any:
        message = original(*args, **kwargs)
        message.topic = topic
        return message

    agent.to_message = on_topic
    try:
        await agent.put(value, key=key, partition=partition)
    finally:
        del agent.to_message


async def _tick(asm: AssemblerApp, agent: Any, partition: int) -> None:
    await _put_on(agent, asm.config.ticks_topic, b"0", TICK_KEY, partition)


async def test_group_agent_forwards_complete_groups_and_dead_letters_garbage() -> None:
    asm, out = _assembler()
    async with asm.group_agent.test_context() as agent:
        await _put_trajectory(agent, make_trajectory("g0", 0), partition=1)
        assert out.outputs == []
        await _put_trajectory(agent, make_trajectory("g0", 0), partition=1)  # duplicate
        await _put_trajectory(agent, make_trajectory("g0", 1), partition=1)
        await agent.put(b"not avro", key=b"g9", partition=0)
    groups = out.on(asm.config.groups_topic)
    assert len(groups) == 1 and groups[0].key == b"policy"
    assert asm.stats.duplicates == 1 and asm.stats.groups_complete == 1
    (letter,) = out.on(asm.config.dlq_topic)
    dead = decode(letter.value, DeadLetter)
    assert dead.key == b"g9" and dead.value == b"not avro" and dead.error_type
    assert asm.groups_table["g0"]["closed_ms"] > 0  # state lives in the Faust table


async def test_invalid_trajectory_is_dead_lettered() -> None:
    asm, out = _assembler()
    bad = make_trajectory("g0", 0)
    bad.loss_mask = bad.loss_mask[:-1]
    async with asm.group_agent.test_context() as agent:
        await _put_trajectory(agent, bad)
    (letter,) = out.on(asm.config.dlq_topic)
    assert "loss_mask" in decode(letter.value, DeadLetter).reason
    assert asm.stats.undecodable == 1 and len(asm.groups_table) == 0


async def test_token_ids_outside_the_models_vocabulary_are_dead_lettered() -> None:
    """With `filtering.vocab_size`, a sample tokenized for a bigger vocabulary never reaches a
    batch: it is dead-lettered with its reason, and its group stays incomplete."""
    import numpy as np

    from stacx.consumers.assembly import SampleFilter

    forwarder = ListForwarder()
    config = AssemblerApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}", partitions=2,
        grouping=GroupAssembler.Config(group_size=2), mixture=MixturePlanner.Config(batch_size=2),
        filtering=SampleFilter.Config(vocab_size=256))
    asm = AssemblerApp(config, forwarder=forwarder, clock=FakeClock(), codec=Codec(),
                       gap_reader=RecordsReader())
    good, foreign = make_trajectory("g0", 0), make_trajectory("g0", 1)
    ids = np.asarray(foreign.token_ids).copy()
    ids[-1] = 263
    foreign.token_ids = ids.astype(np.asarray(foreign.token_ids).dtype)
    assert int(np.asarray(good.token_ids).max()) < 256
    async with asm.group_agent.test_context() as agent:
        await _put_trajectory(agent, good)
        await _put_trajectory(agent, foreign)
    (letter,) = forwarder.on(asm.config.dlq_topic)
    reason = decode(letter.value, DeadLetter).reason
    assert "token ids [263] are outside the vocabulary [0, 256)" in reason
    assert forwarder.on(asm.config.groups_topic) == [] and asm.stats.invalid == 1
    assert asm.stats.undecodable == 0  # it decoded: a vocabulary rejection is not "undecodable"


async def test_tick_events_close_timed_out_groups() -> None:
    clock = FakeClock()
    asm, out = _assembler(clock, group_timeout_s=5)
    async with asm.group_agent.test_context() as agent:
        await _put_trajectory(agent, make_trajectory("g0", 0), partition=1)
        clock.now_ms += 4_999
        await _tick(asm, agent, partition=1)  # not yet
        clock.now_ms += 1
        await _tick(asm, agent, partition=0)  # other partition: untouched
        assert out.on(asm.config.groups_topic) == []
        await _tick(asm, agent, partition=1)
    assert len(out.on(asm.config.groups_topic)) == 1 and asm.stats.groups_timed_out == 1


async def test_a_record_keyed_like_a_tick_is_still_a_trajectory() -> None:
    asm, out = _assembler()
    first, second = make_trajectory("g0", 0), make_trajectory("g0", 1)
    async with asm.group_agent.test_context() as agent:
        await agent.put(encode(first), key=TICK_KEY, partition=0)  # on the trajectories topic
        await agent.put(encode(second), key=b"g0", partition=0)
    assert asm.stats.trajectories == 2 and len(out.on(asm.config.groups_topic)) == 1


async def test_dead_letters_keep_the_original_headers() -> None:
    asm, out = _assembler()
    headers = {"traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    async with asm.group_agent.test_context() as agent:
        await agent.put(b"not avro", key=b"g1", partition=0, headers=headers)
    (letter,) = out.on(asm.config.dlq_topic)
    assert decode(letter.value, DeadLetter).headers == {"traceparent": headers["traceparent"].decode()}


async def test_wrong_record_type_on_the_trajectories_topic_is_dead_lettered() -> None:
    asm, out = _assembler()
    async with asm.group_agent.test_context() as agent:
        await agent.put(encode(WeightVersion(model_name="m", version=1, path="/p")), key=b"m")
    (letter,) = out.on(asm.config.dlq_topic)
    dead = decode(letter.value, DeadLetter)
    assert dead.error_type == "InvalidTrajectoryError" and "WeightVersion" in dead.reason


def _newer_trajectory_event(traj: Trajectory) -> tuple[bytes, SchemaInfo]:
    """`traj` as written by a newer producer whose Trajectory has one more field (with a default)."""
    current = Codec().local_schema(Trajectory)
    datum = fastavro.schemaless_reader(io.BytesIO(encode(traj)[10:]), current.parsed, None)
    extra = {"name": "origin", "type": "string", "default": ""}
    newer = load_schema({**current.schema, "fields": [*current.schema["fields"], extra]})
    body = io.BytesIO()
    fastavro.schemaless_writer(body, newer.parsed, {**datum, "origin": "canary"})
    return SINGLE_OBJECT_MARKER + bytes.fromhex(newer.fingerprint) + body.getvalue(), newer


async def test_a_compatible_newer_trajectory_is_assembled_through_the_catalogue() -> None:
    newer_event, newer = _newer_trajectory_event(make_trajectory("g0", 1))
    asm, out = _assembler(codec=Codec(resolver={newer.fingerprint: newer}.get))
    async with asm.group_agent.test_context() as agent:
        await _put_trajectory(agent, make_trajectory("g0", 0))
        await agent.put(newer_event, key=b"g0", partition=0)
    assert out.on(asm.config.dlq_topic) == [] and len(out.on(asm.config.groups_topic)) == 1


async def test_weights_agent_drives_the_staleness_filter() -> None:
    asm, out = _assembler()
    asm.config.filtering.max_staleness = 1
    async with asm.weights_agent.test_context() as agent:
        for version in (3, 5, 4):  # out-of-order versions never move the latest back
            wv = WeightVersion(model_name="policy", version=version, path="/w")
            await agent.put(encode(wv), key=b"policy")
    assert asm.latest_versions["policy"] == 5
    async with asm.group_agent.test_context() as agent:
        await _put_trajectory(agent, make_trajectory("g0", 0, policy_version=5))
        await _put_trajectory(agent, make_trajectory("g0", 1, policy_version=3))
    assert asm.stats.stale == 1


async def test_batch_agent_packs_groups_and_ignores_redelivery() -> None:
    asm, out = _assembler()
    async with asm.group_agent.test_context() as agent:
        for g in ("g0", "g1"):
            for i in range(2):
                await _put_trajectory(agent, make_trajectory(g, i))
    groups = out.on(asm.config.groups_topic)
    async with asm.batch_agent.test_context() as agent:
        for output in groups + groups[:1]:  # the first group is delivered twice
            await agent.put(output.value, key=output.key)
    (batch_out,) = out.on(asm.config.batches_topic)
    batch = decode(batch_out.value, TrainingBatch)
    expected_ids = [make_trajectory(g, i).trajectory_id for g in ("g0", "g1") for i in range(2)]
    assert batch.trajectory_ids == expected_ids
    assert batch_out.key == batch.batch_id.encode() == batch_id(expected_ids).encode()
    assert asm.stats.groups_redelivered == 1 and len(asm.pool) == 0


async def test_replaying_the_same_groups_yields_the_same_batches() -> None:
    batch_ids = []
    for _ in range(2):
        asm, out = _assembler()
        async with asm.group_agent.test_context() as agent:
            for g in ("a", "b", "c", "d"):
                for i in range(2):
                    await _put_trajectory(agent, make_trajectory(g, i))
        async with asm.batch_agent.test_context() as agent:
            for output in out.on(asm.config.groups_topic):
                await agent.put(output.value, key=output.key)
        batch_ids.append([o.key for o in out.on(asm.config.batches_topic)])
    assert len(batch_ids[0]) == 2 and batch_ids[0] == batch_ids[1]
