"""OffsetGuard and InputOrder: each event of a held input once, in offset order."""

from __future__ import annotations

from confluent_kafka import Message
from faust.types import TP

from stacx.consumers.assembly.gaps import InputOrder, OffsetGuard
from stacx.consumers.assembly.testing import RecordsReader


def test_events_in_order_are_taken_and_nothing_is_missing() -> None:
    guard = OffsetGuard()
    guard.start("p0", 5, now=0)
    assert guard.knows("p0") and not guard.knows("p1")
    taken = [guard.admit("p0", offset, now=0) for offset in (5, 6, 7)]
    assert taken == [range(5, 5), range(6, 6), range(7, 7)]


def test_an_event_past_the_next_offset_names_the_missing_ones() -> None:
    guard = OffsetGuard()
    guard.start("p0", 4, now=0)  # the committed offset: the event there was dropped
    assert guard.admit("p0", 6, now=0) == range(4, 6)
    assert guard.admit("p0", 7, now=0) == range(7, 7)


def test_a_second_delivery_of_a_taken_event_is_skipped() -> None:
    guard = OffsetGuard()
    guard.start("p0", 0, now=0)
    for offset in range(3):
        guard.admit("p0", offset, now=0)
    assert guard.admit("p0", 1, now=0) is None and guard.admit("p0", 2, now=0) is None  # re-read
    assert guard.admit("p0", 3, now=0) == range(3, 3)


def test_partitions_are_independent_and_forgotten_when_revoked() -> None:
    guard = OffsetGuard()
    guard.start("p0", 10, now=0)
    guard.start("p1", 0, now=0)
    assert guard.admit("p1", 0, now=0) == range(0, 0) and guard.admit("p0", 10, now=0) == range(10, 10)
    guard.forget({"p0"})
    assert not guard.knows("p0") and guard.knows("p1")
    assert guard.admit("p0", 3, now=0) == range(3, 3)  # unknown again: starts at its first event


def test_a_quiet_partition_behind_its_end_is_stalled_only_after_the_quiet_time() -> None:
    guard = OffsetGuard()
    guard.assigned({"p0"}, now=0)
    guard.start("p0", 4, now=0)
    guard.admit("p0", 4, now=1)
    assert guard.stalled("p0", end=8, now=3, quiet_s=5) is None  # events may still be on their way
    assert guard.stalled("p0", end=5, now=9, quiet_s=5) is None  # nothing missing
    assert guard.stalled("p0", end=8, now=6, quiet_s=5) == range(5, 8)
    assert guard.quiet("p0", now=6, quiet_s=5) and not guard.quiet("p1", now=6, quiet_s=5)
    guard.skip_to("p0", 8, now=6)
    assert guard.next_offset("p0") == 8 and not guard.quiet("p0", now=10, quiet_s=5)


def _records(topic: str, offsets: range) -> list[Message]:
    return [Message(topic=topic, partition=0, offset=o, value=b"%d" % o) for o in offsets]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_dropped_tail_of_a_quiet_partition_is_read_from_kafka() -> None:
    tp, clock = TP("traj", 0), Clock()
    reader = RecordsReader(_records("traj", range(0, 6)), start=2)
    order = InputOrder(lambda: reader, quiet_s=5, clock=clock)
    await order.assigned({tp})
    assert await order.take(tp, 2) == []  # the committed offset arrives; 3..5 are dropped
    clock.now = 4
    assert await order.stalled(tp) == [] and reader.reads == []  # not quiet long enough
    clock.now = 6
    assert [r.offset() for r in await order.stalled(tp)] == [3, 4, 5]
    assert await order.take(tp, 4) is None  # Faust delivers one after all: skipped
    assert [r.offset() for r in await order.take(tp, 7) or []] == []  # offset 6 has no record


async def test_a_quiet_partition_with_nothing_delivered_is_behind() -> None:
    tp, clock = TP("groups", 0), Clock()
    reader = RecordsReader(_records("groups", range(0, 3)))
    order = InputOrder(lambda: reader, quiet_s=5, clock=clock)
    await order.assigned({tp})
    clock.now = 6
    assert await order.behind(tp)  # nothing arrived and Kafka has 3 records
    assert not await order.behind(tp)  # checked: quiet again from now
    assert [r.offset() for r in await order.take(tp, 3) or []] == [0, 1, 2]  # the poke reveals them
    clock.now = 12
    assert not await order.behind(tp)  # all delivered now


async def test_a_quiet_check_reads_at_most_max_read_records() -> None:
    tp, clock = TP("traj", 0), Clock()
    reader = RecordsReader(_records("traj", range(0, 10)))
    order = InputOrder(lambda: reader, quiet_s=5, max_read=4, clock=clock)
    await order.assigned({tp})
    clock.now = 6
    assert [r.offset() for r in await order.stalled(tp)] == [0, 1, 2, 3]
    assert await order.take(tp, 4) == []  # the next one is expected at 4
