"""The Faust agents under `agent.test_context()` (in-memory channels, memory:// tables)."""

from __future__ import annotations

import uuid
from typing import Any

from consumers.assembly import TICK_KEY, AssemblerApp, GroupAssembler, MixturePlanner
from consumers.assembly.packing import batch_id
from consumers.assembly.testing import ListForwarder, make_trajectory
from schemas.codec import decode, encode
from schemas.records import DeadLetter, TrainingBatch, Trajectory, WeightVersion


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def _assembler(
    clock: FakeClock | None = None, **grouping: Any
) -> tuple[AssemblerApp, ListForwarder]:
    forwarder = ListForwarder()
    config = AssemblerApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=2,
        grouping=GroupAssembler.Config(group_size=2, **grouping),
        mixture=MixturePlanner.Config(batch_size=2),
    )
    return AssemblerApp(config, forwarder=forwarder, clock=clock or FakeClock()), forwarder


async def _put_trajectory(agent: Any, traj: Trajectory, partition: int = 0) -> None:
    await agent.put(encode(traj), key=traj.group_id.encode(), partition=partition)


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


async def test_tick_events_close_timed_out_groups() -> None:
    clock = FakeClock()
    asm, out = _assembler(clock, group_timeout_s=5)
    async with asm.group_agent.test_context() as agent:
        await _put_trajectory(agent, make_trajectory("g0", 0), partition=1)
        clock.now_ms += 4_999
        await agent.put(b"0", key=TICK_KEY, partition=1)  # not yet
        clock.now_ms += 1
        await agent.put(b"0", key=TICK_KEY, partition=0)  # other partition: untouched
        assert out.on(asm.config.groups_topic) == []
        await agent.put(b"0", key=TICK_KEY, partition=1)
    assert len(out.on(asm.config.groups_topic)) == 1 and asm.stats.groups_timed_out == 1


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
    assert asm.stats.groups_redelivered == 1 and len(asm.pool_table) == 0


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
