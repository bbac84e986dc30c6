"""OffsetGuard: the next offset each partition's agent must see."""

from __future__ import annotations

from consumers.assembly.gaps import OffsetGuard


def test_events_in_order_are_taken_and_nothing_is_missing() -> None:
    guard = OffsetGuard()
    guard.start("p0", 5)
    assert guard.knows("p0") and not guard.knows("p1")
    assert [guard.admit("p0", offset) for offset in (5, 6, 7)] == [range(5, 5), range(6, 6), range(7, 7)]


def test_an_event_past_the_next_offset_names_the_missing_ones() -> None:
    guard = OffsetGuard()
    guard.start("p0", 4)  # the committed offset: the event there was dropped
    assert guard.admit("p0", 6) == range(4, 6)
    assert guard.admit("p0", 7) == range(7, 7)


def test_a_second_delivery_of_a_taken_event_is_skipped() -> None:
    guard = OffsetGuard()
    guard.start("p0", 0)
    for offset in range(3):
        guard.admit("p0", offset)
    assert guard.admit("p0", 1) is None and guard.admit("p0", 2) is None  # re-read after a seek
    assert guard.admit("p0", 3) == range(3, 3)


def test_partitions_are_independent_and_forgotten_when_revoked() -> None:
    guard = OffsetGuard()
    guard.start("p0", 10)
    guard.start("p1", 0)
    assert guard.admit("p1", 0) == range(0, 0) and guard.admit("p0", 10) == range(10, 10)
    guard.forget({"p0"})
    assert not guard.knows("p0") and guard.knows("p1")
    assert guard.admit("p0", 3) == range(3, 3)  # unknown again: starts at its first event
