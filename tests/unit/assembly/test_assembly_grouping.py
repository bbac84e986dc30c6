"""Stage 1 on plain dicts: completion, duplicates, late samples, failures, staleness, timeouts."""

from __future__ import annotations

from typing import Any

import pytest

from stacx.consumers.assembly import (
    AssemblyConfigError,
    AssemblyStats,
    GroupAssembler,
    ReadyGroup,
    SampleFilter,
)
from stacx.consumers.assembly.testing import ReadCountingTable, WriteCountingTable, make_trajectory
from stacx.schemas.codec import decode, encode
from stacx.schemas.records import Trajectory, TrajectoryStatus


class Harness:
    def __init__(self, latest: dict[str, int] | None = None, **config: Any) -> None:
        filter_keys = {"failure_policy", "max_staleness", "ok_statuses"}
        self.stats = AssemblyStats()
        self.groups: dict[str, Any] = {}
        self.payloads: dict[str, bytes] = {}
        self.grouper = GroupAssembler(
            GroupAssembler.Config(**{k: v for k, v in config.items() if k not in filter_keys}),
            sample_filter=SampleFilter(
                SampleFilter.Config(**{k: v for k, v in config.items() if k in filter_keys}),
                latest or {},
            ),
            groups=self.groups,
            payloads=self.payloads,
            stats=self.stats,
        )

    def add(self, traj: Trajectory, now_ms: int = 1000) -> ReadyGroup | None:
        return self.grouper.on_trajectory(traj, encode(traj), partition=0, now_ms=now_ms)


def test_group_completes_at_n_samples_in_sample_order() -> None:
    h = Harness(group_size=3)
    samples = [make_trajectory("g", i) for i in (2, 0, 1)]
    assert h.add(samples[0]) is None and h.add(samples[1]) is None
    group = h.add(samples[2])
    assert group is not None and group.closed_reason == "complete"
    assert [decode(p, Trajectory).sample_index for p in group.payloads] == [0, 1, 2]
    assert h.payloads == {}  # payloads leave the table once the group closes
    assert h.stats.groups_complete == 1 and h.stats.kept == 3


def test_duplicates_and_late_samples_are_dropped() -> None:
    h = Harness(group_size=2)
    first = make_trajectory("g", 0)
    h.add(first)
    assert h.add(first) is None
    assert h.add(make_trajectory("g", 1)) is not None
    assert h.add(first) is None  # duplicate of a closed group's member
    assert h.add(make_trajectory("g", 5)) is None  # new sample of a closed group: late
    assert (h.stats.duplicates, h.stats.late, h.stats.groups_complete) == (2, 1, 1)


@pytest.mark.parametrize(("policy", "flagged", "dropped"), [("drop", 0, 1), ("flag", 1, 0), ("mask", 1, 0)])
def test_failure_policy(policy: str, flagged: int, dropped: int) -> None:
    h = Harness(group_size=2, failure_policy=policy)
    h.add(make_trajectory("g", 0))
    failed = make_trajectory("g", 1, status=TrajectoryStatus.FAILED)
    group = h.add(failed)
    assert group is not None
    assert len(group.payloads) == 2 - dropped
    assert group.flagged_ids == ([failed.trajectory_id] if flagged else [])
    assert (h.stats.failed_flagged, h.stats.failed_dropped) == (flagged, dropped)


def test_stale_samples_are_dropped_against_the_latest_version() -> None:
    h = Harness({"policy": 10}, group_size=2, max_staleness=2)
    h.add(make_trajectory("g", 0, policy_version=8))
    group = h.add(make_trajectory("g", 1, policy_version=7))
    assert group is not None and len(group.payloads) == 1 and group.min_policy_version == 8
    assert h.stats.stale == 1


def test_unknown_model_or_unlimited_staleness_keeps_samples() -> None:
    h = Harness({"other": 10}, group_size=1, max_staleness=0)
    assert h.add(make_trajectory("g", 0, policy_version=0)) is not None
    h2 = Harness({"policy": 10}, group_size=1, max_staleness=None)
    assert h2.add(make_trajectory("g", 0, policy_version=0)) is not None


@pytest.mark.parametrize(
    ("policy", "emitted", "pad_to"), [("drop", False, 0), ("emit", True, 0), ("pad", True, 3)]
)
def test_timeout_applies_the_partial_policy(policy: str, emitted: bool, pad_to: int) -> None:
    h = Harness(group_size=3, group_timeout_s=5, partial_policy=policy)
    h.add(make_trajectory("g", 0), now_ms=1_000)
    h.add(make_trajectory("g", 1), now_ms=2_000)
    assert h.grouper.expire(now_ms=5_999) == []
    ready = h.grouper.expire(now_ms=6_000)
    assert len(ready) == int(emitted) and h.stats.groups_timed_out == 1
    if emitted:
        assert ready[0].closed_reason == "timeout" and ready[0].pad_to == pad_to
        assert len(ready[0].payloads) == 2
    assert h.add(make_trajectory("g", 2), now_ms=7_000) is None and h.stats.late == 1


def test_min_group_size_and_partition_scoping(caplog: pytest.LogCaptureFixture) -> None:
    h = Harness(group_size=4, group_timeout_s=1, min_group_size=2)
    h.grouper.on_trajectory(make_trajectory("a", 0), b"x", partition=0, now_ms=1)
    h.grouper.on_trajectory(make_trajectory("b", 0), b"y", partition=1, now_ms=1)
    with caplog.at_level("INFO", logger="stacx.consumers.assembly"):
        assert h.grouper.expire(now_ms=5000, partition=1) == []  # dropped: 1 < min_group_size
    assert [r.getMessage() for r in caplog.records] == [
        "group b of policy dropped: partial (1 of 4 trainable, policy emit, min_group_size 2)"]
    assert h.groups["a"]["closed_ms"] == 0 and h.groups["b"]["closed_ms"] > 0
    assert h.stats.groups_dropped == 1


def test_closed_groups_are_forgotten_after_the_ttl() -> None:
    h = Harness(group_size=1, closed_ttl_s=10)
    h.add(make_trajectory("g", 0), now_ms=1_000)
    h.grouper.expire(now_ms=10_999)
    assert "g" in h.groups
    h.grouper.expire(now_ms=11_000)
    assert "g" not in h.groups


def test_config_errors_name_the_field() -> None:
    with pytest.raises(AssemblyConfigError, match="grouping.group_size"):
        GroupAssembler.Config(group_size=0)
    with pytest.raises(AssemblyConfigError, match="grouping.min_group_size"):
        GroupAssembler.Config(group_size=2, min_group_size=3)
    with pytest.raises(AssemblyConfigError, match="filtering.max_staleness"):
        SampleFilter.Config(max_staleness=-1)


def test_downtime_does_not_time_out_the_groups_open_before_it() -> None:
    """Break 5: after a 60 s restart the first tick closed the groups open before the crash as
    partial, and their remaining samples were dropped as late (39 of 512 lost in one run)."""
    h = Harness(group_size=3, group_timeout_s=30, partial_policy="emit")
    h.add(make_trajectory("g", 0), now_ms=0)
    for t in range(1_000, 11_000, 1_000):  # ticks while the worker runs
        assert h.grouper.expire(now_ms=t, partition=0) == []
    # the worker is down for 100 s; the first tick after the restart
    assert h.grouper.expire(now_ms=110_000, partition=0) == []
    assert h.add(make_trajectory("g", 1), now_ms=111_000) is None
    group = h.add(make_trajectory("g", 2), now_ms=112_000)
    assert group is not None and group.closed_reason == "complete" and len(group.payloads) == 3
    assert h.stats.late == 0 and h.stats.groups_timed_out == 0


def test_timeouts_still_fire_on_a_running_worker() -> None:
    h = Harness(group_size=3, group_timeout_s=5, max_clock_step_s=2)
    h.add(make_trajectory("g", 0), now_ms=0)
    ready = []
    for t in range(1_000, 8_000, 1_000):
        ready += h.grouper.expire(now_ms=t, partition=0)
    assert len(ready) == 1 and ready[0].closed_reason == "timeout"


def test_a_regenerated_sample_of_a_filled_slot_is_a_duplicate() -> None:
    """A restarted rollout worker generates a group's sample again under a newer policy (another
    trajectory id): the slot is filled already, so the group does not take a second copy."""
    h = Harness(group_size=2)
    assert h.add(make_trajectory("g", 0, policy_version=1)) is None
    assert h.add(make_trajectory("g", 0, policy_version=2)) is None
    assert h.stats.duplicates == 1
    group = h.add(make_trajectory("g", 1, policy_version=2))
    assert group is not None
    assert sorted(decode(p, Trajectory).sample_index for p in group.payloads) == [0, 1]
    assert h.add(make_trajectory("g", 1, policy_version=3)) is None and h.stats.duplicates == 2
    assert h.stats.late == 0


def test_the_completing_sample_is_never_written_to_the_payloads_table() -> None:
    h = Harness(group_size=3)
    h.grouper._payloads = table = WriteCountingTable()
    samples = [make_trajectory("g", i) for i in range(3)]
    h.add(samples[0])
    h.add(samples[1])
    group = h.add(samples[2])
    assert group is not None
    assert [decode(p, Trajectory).trajectory_id for p in group.payloads] == [s.trajectory_id for s in samples]
    assert table.writes == 4 and table == {}  # two writes and two deletes: none for the last sample


def clocked_harness(clocks: dict[str, Any], groups: dict[str, Any] | None = None, **config: Any) -> Harness:
    h = Harness(**config)
    h.grouper = GroupAssembler(
        h.grouper.config, sample_filter=SampleFilter(SampleFilter.Config(), {}), groups=groups or h.groups,
        payloads=h.payloads, stats=h.stats, clocks=clocks,
    )  # fmt: skip
    return h


def test_samples_joining_an_open_group_write_no_clock_record() -> None:
    clocks = WriteCountingTable()
    h = clocked_harness(clocks, group_size=4)
    h.add(make_trajectory("g", 0), now_ms=1_000)  # opens a group: the clock is written
    assert clocks.writes == 1
    for i, t in ((1, 2_000), (2, 3_000)):
        h.add(make_trajectory("g", i), now_ms=t)
    assert clocks.writes == 1
    h.add(make_trajectory("h", 0), now_ms=4_000)  # another group opens
    assert clocks.writes == 2 and clocks["0"] == [3_000, 4_000]
    assert h.grouper.expire(now_ms=5_000, partition=0) == [] and clocks.writes == 3  # ticks write


def test_a_restart_resumes_the_clock_from_the_last_tick_or_opening() -> None:
    clocks: dict[str, Any] = {}
    h = clocked_harness(clocks, group_size=3, group_timeout_s=10, max_clock_step_s=5)
    h.add(make_trajectory("g", 0), now_ms=0)
    h.grouper.expire(now_ms=1_000, partition=0)
    h.add(make_trajectory("g", 1), now_ms=1_500)  # in memory only
    assert clocks["0"] == [1_000, 1_000]
    restarted = clocked_harness(clocks, groups=h.groups, group_size=3, group_timeout_s=10, max_clock_step_s=5)
    restarted.payloads.update(h.payloads)
    ready = []
    for t in range(60_000, 80_000, 1_000):  # down 59 s: the first tick counts max_clock_step_s only
        ready += restarted.grouper.expire(now_ms=t, partition=0)
        if ready:
            break
    # opened at clock 0; restored clock 1,000 + 5,000 at the first tick, then 1,000 per tick
    assert t == 64_000 and len(ready) == 1 and ready[0].closed_reason == "timeout"
    assert len(ready[0].payloads) == 2  # the group and payload tables are written per sample


def test_a_clock_changed_by_another_worker_is_read_back() -> None:
    clocks: dict[str, Any] = {}
    h = clocked_harness(clocks, group_size=4)
    h.add(make_trajectory("g", 0), now_ms=1_000)
    h.add(make_trajectory("g", 1), now_ms=2_000)  # cached: clock 1,000 in memory
    clocks["0"] = [50_000, 2_500]  # the partition moved away and back: another worker's clock
    assert h.grouper.advance_clock(0, 3_000) == 50_500


def test_an_expiry_pass_touches_only_the_groups_that_are_due() -> None:
    groups = ReadCountingTable()
    h = Harness(group_size=2, group_timeout_s=10, closed_ttl_s=100)
    h.grouper = GroupAssembler(
        h.grouper.config, sample_filter=SampleFilter(SampleFilter.Config(), {}), groups=groups,
        payloads=h.payloads, stats=h.stats,
    )  # fmt: skip
    for g in range(200):  # 200 closed groups, remembered for the TTL
        h.add(make_trajectory(f"c{g}", 0), now_ms=1_000)
        h.add(make_trajectory(f"c{g}", 1), now_ms=1_000)
    h.add(make_trajectory("open", 0), now_ms=1_000)
    h.grouper.expire(now_ms=2_000, partition=0)  # the first pass indexes the table once
    groups.reads = 0
    for t in range(3_000, 11_000, 1_000):  # eight passes, nothing due
        assert h.grouper.expire(now_ms=t, partition=0) == []
    assert groups.reads == 0
    (timed_out,) = h.grouper.expire(now_ms=11_000, partition=0)  # the open group is due
    assert timed_out.group_id == "open" and groups.reads <= 2
    groups.reads = 0
    assert h.grouper.expire(now_ms=101_000, partition=0) == []  # the TTL: 200 groups forgotten
    assert groups.reads <= 2 * 200 and set(groups) == {"open"}  # at most two heap entries each
