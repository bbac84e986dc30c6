"""Held acknowledgements: open groups in memory, the trajectories topic as their changelog."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from confluent_kafka import Message
from faust.types import TP

from stacx.consumers.assembly import TICK_KEY, AssemblerApp, GroupAssembler, MixturePlanner, Output
from stacx.consumers.assembly.batched import batch_group_ids
from stacx.consumers.assembly.holding import GroupRecords, HeldAcks, PendingMarks, TrackedPool
from stacx.consumers.assembly.testing import (
    ListForwarder,
    RecordsReader,
    WriteCountingTable,
    kafka_record,
    make_trajectory,
    on_topic,
)
from stacx.schemas.codec import Codec, encode
from stacx.schemas.records import TrainingBatch


def test_events_are_acknowledged_in_offset_order_per_partition() -> None:
    held: HeldAcks[str] = HeldAcks()
    a0, a1, a2 = (held.arrived("p0", f"a{i}") for i in range(3))
    b0 = held.arrived("p1", "b0")
    held.hold("g", a0)  # the first event of an open group
    held.done(a1)
    held.hold("g", a2)
    held.done(b0)
    assert held.ready() == ["b0"]  # another partition is not held back
    assert held.ready() == [] and held.num_waiting == 3  # a1 is done but waits behind a0
    held.release("g")
    assert held.ready() == ["a0", "a1", "a2"] and held.num_waiting == 0


def test_a_later_group_closing_first_waits_for_the_older_open_group() -> None:
    held: HeldAcks[int] = HeldAcks()
    old, young, young_last = (held.arrived("p0", offset) for offset in (10, 11, 12))
    held.hold("old", old)
    held.hold("young", young)
    held.hold("young", young_last)
    held.release("young")
    assert held.ready() == []  # committing 13 would skip the open group's offset 10
    held.release("old")
    assert held.ready() == [10, 11, 12]


def test_revoked_partitions_are_forgotten_unacknowledged() -> None:
    held: HeldAcks[str] = HeldAcks()
    held.hold("g", held.arrived("p0", "a0"))
    held.hold("h", held.arrived("p1", "b0"))
    held.drop({"p0"})
    assert not held.is_held("g") and held.is_held("h")
    held.release("g")  # a late release of a dropped group acknowledges nothing
    assert held.ready() == [] and held.num_waiting == 1


def test_group_records_write_the_table_once_per_group_after_delivery() -> None:
    table = WriteCountingTable()
    records = GroupRecords(table)
    record = {"partition": 0, "closed_ms": 0, "members": {}}
    for i in range(3):  # samples joining an open group
        records["g"] = {**record, "members": {f"t{j}": [j] for j in range(i + 1)}}
    assert table.writes == 0 and "g" in records.open
    records["g"] = {**records["g"], "closed_ms": 5}
    assert records.take_just_closed() == ["g"] and table.writes == 0
    assert records["g"]["closed_ms"] == 5  # a closing group still rejects late samples
    records.confirm("g")
    assert table.writes == 1 and table["g"]["closed_ms"] == 5 and not records.closing


def test_group_records_drop_revoked_partitions() -> None:
    records = GroupRecords({})
    records["a"] = {"partition": 0, "closed_ms": 0, "members": {}}
    records["b"] = {"partition": 1, "closed_ms": 0, "members": {}}
    records["c"] = {"partition": 1, "closed_ms": 7, "members": {}}
    assert set(records.drop_partitions({1})) == {"b", "c"}
    assert list(records) == ["a"]


class HeldDeliveries(ListForwarder):
    """Hands outputs on like Kafka does: a future per record, completed when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[asyncio.Future[Any]] = []

    async def send(self, output: Output) -> asyncio.Future[Any]:
        await super().send(output)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def deliver(self) -> None:
        for future in self.pending:
            future.set_result(None)
        self.pending.clear()


def _assembler(
    forwarder: ListForwarder, reader: RecordsReader | None = None, *, quiet_check_s: float = 5.0
) -> AssemblerApp:
    config = AssemblerApp.Config(
        quiet_check_s=quiet_check_s,
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=2,
        grouping=GroupAssembler.Config(group_size=2),
        mixture=MixturePlanner.Config(batch_size=2),
    )
    return AssemblerApp(config, forwarder=forwarder, codec=Codec(), gap_reader=reader or RecordsReader())


async def _put(agent: Any, group: str, index: int, partition: int = 0) -> None:
    traj = make_trajectory(group, index)
    await agent.put(encode(traj), key=traj.group_id.encode(), partition=partition)


async def test_samples_of_an_open_group_stay_unacknowledged_until_its_output_is_delivered() -> None:
    out = HeldDeliveries()
    asm = _assembler(out)
    async with asm.group_agent.test_context() as agent:
        await _put(agent, "g", 0)
        await _put(agent, "h", 0)
        await _put(agent, "h", 1)  # h closes first, behind g's open sample
        await _put(agent, "x", 0, partition=1)
        assert asm.held.num_waiting == 4 and "h" not in asm.groups_table
        out.deliver()
        await _put(agent, "x", 1, partition=1)  # x closes: output pending; h is of partition 0
        assert "h" not in asm.groups_table and asm.held.num_waiting == 5
        await _put(agent, "g", 1)  # an event of partition 0: h is confirmed, g is sent
        assert "h" in asm.groups_table and "g" not in asm.groups_table
        assert asm.held.num_waiting == 6  # g is not delivered: partition 0 (4) and x (2) wait
        out.deliver()
        await _put(agent, "z", 0)  # z opens; g is confirmed and g, h are acknowledged
        assert "g" in asm.groups_table and asm.held.num_waiting == 3  # x (2) and z (1)
    assert len(out.on(asm.config.groups_topic)) == 3 and set(asm.group_records.open) == {"z"}


async def test_ticks_and_duplicates_are_acknowledged_at_once() -> None:
    asm = _assembler(ListForwarder())
    async with asm.group_agent.test_context() as agent:
        await _put(agent, "g", 0, partition=1)
        with on_topic(agent, asm.config.ticks_topic):
            await agent.put(b"0", key=TICK_KEY, partition=0)
        assert asm.held.num_waiting == 1  # the tick went through, g's sample is held
        await _put(agent, "g", 1, partition=1)
        await _put(agent, "g", 1, partition=1)  # a duplicate of a closed group
    assert asm.held.num_waiting == 0 and asm.stats.duplicates == 1


async def test_revoking_a_partition_drops_its_open_groups() -> None:
    asm = _assembler(ListForwarder())
    topic = asm.config.trajectories_topic
    async with asm.group_agent.test_context() as agent:
        with on_topic(agent, topic):
            await _put(agent, "g", 0, partition=0)
            await _put(agent, "h", 0, partition=1)
        await asm._on_partitions_revoked(asm.app, {TP(topic, 0), TP(asm.config.ticks_topic, 0)})
        assert set(asm.group_records.open) == {"h"} and asm.held.num_waiting == 1
        assert list(asm.open_payloads) == [make_trajectory("h", 0).trajectory_id]


async def test_pooled_groups_stay_unacknowledged_until_their_batch_is_delivered() -> None:
    out = HeldDeliveries()
    asm = _assembler(out)
    async with asm.group_agent.test_context() as agent:
        for group in ("g0", "g1", "g2"):
            for index in range(2):
                await _put(agent, group, index)
        out.deliver()
        await _put(agent, "open", 0)  # the closed groups' deliveries are confirmed
    groups = out.on(asm.config.groups_topic)
    assert asm.in_flight == 0
    async with asm.batch_agent.test_context() as agent:
        await agent.put(groups[0].value, key=groups[0].key)
        assert asm.pool_held.num_waiting == 1 and "g0" in asm.pool
        await agent.put(groups[1].value, key=groups[1].key)  # a batch of g0, g1: not delivered
        assert len(asm.pool) == 0 and asm.pool_held.num_waiting == 2 and asm.in_flight == 1
        assert "g0" in asm.packed_marks and "g0" not in asm.packed_table
        await agent.put(groups[0].value, key=groups[0].key)  # redelivered: done at once
        assert asm.pool_held.num_waiting == 3 and asm.stats.groups_redelivered == 1
        out.deliver()
        await agent.put(b"", key=TICK_KEY)  # the timer's tick on the groups topic
        assert set(asm.packed_table) == {"g0", "g1"} and asm.pool_held.num_waiting == 0
        await agent.put(groups[2].value, key=groups[2].key)
        assert asm.pool_held.num_waiting == 1 and list(asm.pool) == ["g2"] and asm.in_flight == 0
    assert len(out.on(asm.config.batches_topic)) == 1


def test_pending_marks_reach_the_table_on_confirmation_only() -> None:
    table = WriteCountingTable()
    marks = PendingMarks(table)
    marks["a"], marks["b"] = 1, 2
    assert "a" in marks and table.writes == 0 and sorted(marks) == ["a", "b"]
    marks.confirm(["a"])
    assert table == {"a": 1} and marks.pending == {"b": 2}
    del marks["a"], marks["b"]
    assert len(marks) == 0


def test_tracked_pool_reports_what_entered_and_left() -> None:
    pool = TrackedPool()
    pool["a"], pool["b"] = b"1", b"2"
    del pool["a"]
    assert pool.take_changes() == (["a", "b"], ["a"]) and pool.take_changes() == ([], [])


def _acks(asm: AssemblerApp) -> list[int]:
    """Offsets acknowledged to the consumer directly from now on."""
    acked: list[int] = []
    consumer = asm.app.consumer
    original = consumer.ack

    def ack(message: Any) -> bool:
        acked.append(message.offset)
        return original(message)

    consumer.ack = ack  # type: ignore[method-assign]
    return acked


async def test_an_event_the_consumer_dropped_is_read_from_kafka_and_processed_first() -> None:
    out, lost = HeldDeliveries(), make_trajectory("g", 0)
    topic = "stacx.trajectories"
    reader = RecordsReader([kafka_record(topic, 0, encode(lost), b"g")])
    asm = _assembler(out, reader)
    acked = _acks(asm)
    async with asm.group_agent.test_context() as agent:
        with on_topic(agent, topic):
            agent.sent_offset = 1  # offset 0, the committed one, never reaches the agent
            await _put(agent, "g", 1)
            assert reader.reads == [(topic, 0, range(0, 1))]
            (group,) = out.on(asm.config.groups_topic)  # g closed with its lost sample
            assert asm.held.num_waiting == 2 and acked == []
            out.deliver()
            await _put(agent, "h", 0)  # g is confirmed: both its events are acknowledged, in order
    # the re-read event through the consumer, the delivered one through the stream
    assert acked == [0] and asm.held.num_waiting == 1 and asm.stats.trajectories == 3


async def test_a_second_delivery_of_a_taken_event_is_skipped() -> None:
    asm = _assembler(ListForwarder())
    topic = asm.config.trajectories_topic
    async with asm.group_agent.test_context() as agent:
        with on_topic(agent, topic):
            await _put(agent, "g", 0)
            agent.sent_offset = 0  # Faust reads from the committed offset again
            await _put(agent, "g", 0)
    assert asm.stats.trajectories == 1 and asm.stats.duplicates == 0 and asm.held.num_waiting == 1


async def test_a_group_the_consumer_dropped_is_read_from_kafka_before_the_next() -> None:
    out = ListForwarder()
    asm = _assembler(out)
    async with asm.group_agent.test_context() as agent:
        for group in ("g0", "g1"):
            for index in range(2):
                await _put(agent, group, index)
    first, second = out.on(asm.config.groups_topic)
    reader = RecordsReader([kafka_record(asm.config.groups_topic, 0, first.value, first.key or b"")])
    asm.gap_reader = reader
    async with asm.batch_agent.test_context() as agent:
        with on_topic(agent, asm.config.groups_topic):
            agent.sent_offset = 1
            await agent.put(second.value, key=second.key)
    (batch,) = out.on(asm.config.batches_topic)
    assert reader.reads == [(asm.config.groups_topic, 0, range(0, 1))]
    assert set(Codec().decode(batch.value, TrainingBatch).group_ids) == {"g0", "g1"}


async def test_the_dropped_last_sample_of_a_quiet_partition_is_read_on_a_tick() -> None:
    out, lost = ListForwarder(), make_trajectory("g", 1)
    topic = "stacx.trajectories"
    reader = RecordsReader([kafka_record(topic, 1, encode(lost), b"g")])
    asm = _assembler(out, reader, quiet_check_s=0.05)
    await asm._on_partitions_assigned(asm.app, {TP(topic, 0)})
    async with asm.group_agent.test_context() as agent:
        with on_topic(agent, topic):
            await _put(agent, "g", 0)  # offset 0; offset 1, the last one, never arrives
        with on_topic(agent, asm.config.ticks_topic):
            await agent.put(b"0", key=TICK_KEY, partition=0)  # too soon: not quiet yet
            assert reader.reads == [] and not out.on(asm.config.groups_topic)
            await asyncio.sleep(0.1)
            await agent.put(b"0", key=TICK_KEY, partition=0)
    assert reader.reads == [(topic, 0, range(1, 2))]
    (group,) = out.on(asm.config.groups_topic)  # g closed with its last sample
    assert asm.stats.trajectories == 2 and asm.held.num_waiting == 0  # delivered: all acknowledged


async def test_groups_a_stopped_worker_batched_but_never_marked_are_not_batched_again() -> None:
    out = ListForwarder()
    asm = _assembler(out)
    async with asm.group_agent.test_context() as agent:
        for group in ("g0", "g1", "g2", "g3"):
            for index in range(2):
                await _put(agent, group, index)
    groups = out.on(asm.config.groups_topic)
    async with asm.batch_agent.test_context() as agent:
        for group in groups[:2]:
            await agent.put(group.value, key=group.key)
    (batch,) = out.on(asm.config.batches_topic)  # delivered; the worker is killed before its marks
    topic = asm.config.groups_topic
    records = [kafka_record(topic, i, g.value, g.key or b"") for i, g in enumerate(groups)]
    records.append(Message(topic=asm.config.batches_topic, partition=0, offset=0, key=batch.key,
                           value=batch.value, headers=batch.headers, timestamp=(1, 1000)))
    again = ListForwarder()
    successor = AssemblerApp(asm.config, forwarder=again, codec=Codec(), gap_reader=RecordsReader(records))
    await successor._on_partitions_assigned(successor.app, {TP(topic, 0)})
    async with successor.batch_agent.test_context() as agent:
        with on_topic(agent, topic):
            for group in groups:  # read again from the committed offset
                await agent.put(group.value, key=group.key)
    (second,) = again.on(asm.config.batches_topic)
    assert set(Codec().decode(second.value, TrainingBatch).group_ids) == {"g2", "g3"}
    assert successor.stats.groups_redelivered == 2

    # a batch written without the header (an earlier version) is decoded for its groups
    bare = Message(topic=asm.config.batches_topic, partition=0, offset=0, value=batch.value,
                   timestamp=(1, 1000))
    assert sorted(batch_group_ids(bare, Codec())) == ["g0", "g1"]
