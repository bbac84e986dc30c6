"""Stage 1: collect the samples of each prompt group, drop duplicates and late arrivals.

A group closes when `group_size` samples have arrived (whatever their verdict), or when
`group_timeout_s` has passed since its first sample. What a group with fewer trainable samples
than `group_size` becomes is the partial-group policy. Closed groups are remembered for
`closed_ttl_s`, so that a duplicate or a late sample of a closed group is recognised.

A sample is a duplicate when its trajectory id, or its slot (sample index) in the group, was
seen: a rollout worker that restarts and generates a group's sample again (under a newer policy,
hence another trajectory id) never adds a second copy of one slot.

Group timeouts run on a per-partition worker clock, not on wall-clock time: it advances with
the events (ticks, samples) of the partition, by at most `max_clock_step_s` between two of them.
While the worker is down nothing advances it, so a restart never turns the groups that were open
before the crash into timed-out partial groups and their remaining samples into late ones.

State lives in `StateTable`s: `groups` (group id -> record, JSON-able), `payloads` (trajectory
id -> encoded bytes, while its group is open) and `clocks` (partition -> [worker-clock ms,
wall-clock ms of the last event]; written on ticks and when a group opens, never behind the
opening of a group). In the worker (`AssemblerApp`) open groups, their payloads and the clocks
are in memory and the trajectories topic is their changelog (`holding`): a group rebuilt from
redelivered samples after a restart opens on the new worker's clock, so it gets its whole
timeout again (it may close later than without the restart, never earlier). Only closed groups
reach a Faust table.

Expiry passes (a tick per partition) touch only what is due: the assembler keeps, per partition,
a heap of open groups by opening clock (timeouts) and one of closed groups by close time (the
TTL). The tables stay the truth: a heap entry is checked against its record when it comes due,
and a partition's records are indexed once from the table on its first pass (a restart, a
partition taken over), so a pass costs the groups it closes or forgets, not every remembered one.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from dataclasses import dataclass
from typing import Any

from pydantic import PositiveFloat, PositiveInt

from stacx.consumers.assembly.envelope import ReadyGroup
from stacx.consumers.assembly.errors import AssemblyConfigError
from stacx.consumers.assembly.filters import SampleFilter, Verdict, oldest_policy_version
from stacx.consumers.assembly.protocols import StateTable
from stacx.consumers.assembly.stats import AssemblyStats, log_dropped
from stacx.schemas.records import Trajectory

__all__ = ["GroupAssembler", "PartialPolicy"]

GroupRecord = dict[str, Any]
_Due = tuple[int | float, int, str]
"""(due key in ms, arrival number, group id): a heap entry."""


class PartialPolicy(enum.StrEnum):
    DROP = "drop"
    """Groups with fewer than `group_size` trainable samples are discarded."""
    EMIT = "emit"
    """Partial groups are packed as they are."""
    PAD = "pad"
    """Partial groups are padded to `group_size` with loss-masked copies of their samples."""


class GroupAssembler:
    """Turns a stream of samples into closed `ReadyGroup`s (one partition's worth of state)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        group_size: PositiveInt = 8
        """Samples per prompt group (`n`): a group is complete when this many have arrived."""
        group_timeout_s: PositiveFloat = 120.0
        """Seconds after a group's first sample after which it closes even if incomplete."""
        partial_policy: PartialPolicy = PartialPolicy.EMIT
        """What to do with a group that has fewer trainable samples than `group_size`."""
        min_group_size: PositiveInt = 1
        """Partial groups with fewer trainable samples than this are dropped."""
        closed_ttl_s: PositiveFloat = 24 * 3600.0
        """How long closed group ids are remembered to recognise duplicates and late samples;
        `AssemblerApp` raises it to the trajectories topic's retention (the replay horizon)."""
        max_clock_step_s: PositiveFloat = 5.0
        """Most the timeout clock advances between two events of a partition (ticks come every
        `tick_interval_s`): a longer gap is downtime, and downtime does not count."""

        def __post_init__(self) -> None:
            self.partial_policy = PartialPolicy(self.partial_policy)
            if self.group_size < 1:
                raise AssemblyConfigError(f"grouping.group_size must be >= 1, got {self.group_size}")
            if not 1 <= self.min_group_size <= self.group_size:
                raise AssemblyConfigError(
                    f"grouping.min_group_size must be in [1, group_size={self.group_size}], "
                    f"got {self.min_group_size}"
                )
            if self.group_timeout_s <= 0 or self.closed_ttl_s <= 0 or self.max_clock_step_s <= 0:
                raise AssemblyConfigError(
                    "grouping.group_timeout_s, grouping.closed_ttl_s and "
                    "grouping.max_clock_step_s must be > 0 seconds"
                )

    def __init__(
        self,
        config: Config,
        *,
        sample_filter: SampleFilter,
        groups: StateTable[GroupRecord],
        payloads: StateTable[bytes],
        stats: AssemblyStats,
        clocks: StateTable[list[int]] | None = None,
    ) -> None:
        self.config = config
        self._filter = sample_filter
        self._groups = groups
        self._payloads = payloads
        self._stats = stats
        self._clocks: StateTable[list[int]] = clocks if clocks is not None else {}
        self._clock_cache: dict[str, tuple[list[int] | None, list[int]]] = {}
        """partition -> (clock last written to the table, clock now)."""
        self._opened: dict[int, list[_Due]] = {}
        """partition -> heap of (opening clock ms, arrival, group id) of open groups."""
        self._closed: dict[int, list[_Due]] = {}
        """partition -> heap of (closed ms, arrival, group id) of closed groups."""
        self._open_due: dict[str, tuple[int, int]] = {}
        """Open group id -> (partition, opening clock ms): tells a live heap entry from a stale one."""
        self._arrivals = itertools.count()
        self._indexed: set[int] = set()
        """Partitions whose table records are in the heaps."""
        self._indexed_all = False

    def advance_clock(self, partition: int, now_ms: int, *, persist: bool = True) -> int:
        """Advance `partition`'s worker clock to wall time `now_ms` (a gap longer than
        `max_clock_step_s` counts as that step only); returns the clock in ms.

        With `persist=False` the step stays in memory until the next persisted one (a tick, a
        new group): a sample joining an open group writes no clock record."""
        key = str(partition)
        stored = self._clocks.get(key)
        cached = self._clock_cache.get(key)
        # the cache holds only while the table still has what this worker wrote (a partition
        # that moved away and back comes with another worker's clock)
        clock, last_ms = cached[1] if cached is not None and cached[0] == stored else (stored or [0, now_ms])
        step = min(max(now_ms - last_ms, 0), int(self.config.max_clock_step_s * 1000))
        current = [clock + step, now_ms]
        if persist:
            self._clocks[key] = current
            stored = current
        self._clock_cache[key] = (stored, current)
        return clock + step

    def _persist_clock(self, partition: int) -> None:
        key = str(partition)
        cached = self._clock_cache.get(key)
        if cached is not None and cached[0] != cached[1]:
            self._clocks[key] = cached[1]
            self._clock_cache[key] = (cached[1], cached[1])

    def on_trajectory(
        self, trajectory: Trajectory, payload: bytes, *, partition: int, now_ms: int
    ) -> ReadyGroup | None:
        """Add one decoded, valid sample; returns its group if this sample completed it."""
        clock = self.advance_clock(partition, now_ms, persist=False)
        record = self._groups.get(trajectory.group_id)
        if record is not None and _seen(record, trajectory):
            self._stats.duplicates += 1
            return None
        if record is not None and record["closed_ms"]:
            self._stats.late += 1
            return None
        opens = record is None
        if record is None:  # a group opens: the clock table never lags an open group
            self._persist_clock(partition)
            record = _new_record(trajectory, partition=partition, now_ms=now_ms, clock_ms=clock)
        verdict = self._filter.verdict(trajectory)
        self._count(verdict)
        record["members"][trajectory.trajectory_id] = [
            trajectory.sample_index,
            verdict.value,
            oldest_policy_version(trajectory),
        ]
        if len(record["members"]) >= self.config.group_size:
            # the completing sample goes straight into the group: no payload write and delete
            self._stats.groups_complete += 1
            last = {trajectory.trajectory_id: payload} if verdict.trainable else {}
            return self._close(trajectory.group_id, record, now_ms=now_ms, reason="complete", last=last)
        if verdict.trainable:
            self._payloads[trajectory.trajectory_id] = payload
        if opens:
            self._track_open(trajectory.group_id, record)
        self._groups[trajectory.group_id] = record
        return None

    def expire(self, *, now_ms: int, partition: int | None = None) -> list[ReadyGroup]:
        """Close timed-out groups and forget old closed ones (of one partition, or all).

        Timeouts are measured on the partition's worker clock (advanced here), the closed-group
        TTL on wall-clock time. Touches only the groups that are due (and, once per partition,
        indexes the table's records)."""
        self._index_table(now_ms, partition)
        timeout_ms = self.config.group_timeout_s * 1000
        horizon_ms = now_ms - self.config.closed_ttl_s * 1000
        if partition is not None:
            parts = [partition]
            self.advance_clock(partition, now_ms)
        else:
            parts = sorted(set(self._opened) | set(self._closed))
        due: dict[str, tuple[GroupRecord, int]] = {}  # a group indexed twice is due once
        for part in parts:
            self._forget_closed(part, horizon_ms)
            timed_out = self._timed_out(part, now_ms, timeout_ms, advance=partition is None)
            for record, arrival, group_id in timed_out:
                due.setdefault(group_id, (record, arrival))
        ready: list[ReadyGroup] = []
        for group_id, (record, _) in sorted(due.items(), key=lambda d: (d[1][0]["opened_ms"], d[1][1])):
            self._stats.groups_timed_out += 1
            group = self._close(group_id, record, now_ms=now_ms, reason="timeout")
            if group is not None:
                ready.append(group)
        return ready

    def forget_partitions(self, partitions: set[int]) -> None:
        """Partitions this worker no longer owns: their heaps go, and a partition that comes back
        is indexed again from the table."""
        for part in partitions:
            self._opened.pop(part, None)
            self._closed.pop(part, None)
            self._indexed.discard(part)
        for group_id in [g for g, (part, _) in self._open_due.items() if part in partitions]:
            del self._open_due[group_id]
        self._indexed_all = False

    def _index_table(self, now_ms: int, partition: int | None) -> None:
        """Put the table's records in the heaps (once per partition): records written by another
        worker or before a restart are due like this worker's own."""
        if self._indexed_all or (partition is not None and partition in self._indexed):
            return
        for group_id, record in list(self._groups.items()):
            part = record["partition"]
            if record["closed_ms"]:
                self._push(self._closed, part, record["closed_ms"], group_id)
                continue
            if "opened_clock_ms" not in record:  # written before the worker clock existed
                record["opened_clock_ms"] = self.advance_clock(part, now_ms)
                self._groups[group_id] = record
            self._track_open(group_id, record)
        if partition is None:
            self._indexed_all = True
        else:
            self._indexed.add(partition)

    def _track_open(self, group_id: str, record: GroupRecord) -> None:
        due = (record["partition"], record["opened_clock_ms"])
        if self._open_due.get(group_id) != due:  # not indexed twice
            self._open_due[group_id] = due
            self._push(self._opened, due[0], due[1], group_id)

    def _push(self, heaps: dict[int, list[_Due]], partition: int, due_ms: int | float, group_id: str) -> None:
        heapq.heappush(heaps.setdefault(partition, []), (due_ms, next(self._arrivals), group_id))

    def _forget_closed(self, partition: int, horizon_ms: float) -> None:
        """Forget the closed groups of `partition` closed at or before `horizon_ms`."""
        heap = self._closed.get(partition, [])
        while heap and heap[0][0] <= horizon_ms:
            closed_ms, _, group_id = heapq.heappop(heap)
            record = self._groups.get(group_id)
            if record is not None and record["closed_ms"] == closed_ms and record["partition"] == partition:
                del self._groups[group_id]

    def _timed_out(
        self, partition: int, now_ms: int, timeout_ms: float, *, advance: bool
    ) -> list[tuple[GroupRecord, int, str]]:
        """Open groups of `partition` whose timeout has passed on its clock (taken off the heap);
        with `advance`, the clock is advanced here when the partition has an open group."""
        heap = self._opened.get(partition, [])
        if advance:
            while heap and self._open_record(partition, heap[0]) is None:
                heapq.heappop(heap)  # a group that closed on its own
            if not heap:
                return []
            clock = self.advance_clock(partition, now_ms)
        else:
            clock = self._clock_cache[str(partition)][1][0]
        due: list[tuple[GroupRecord, int, str]] = []
        while heap and clock - heap[0][0] >= timeout_ms:
            entry = heapq.heappop(heap)
            record = self._open_record(partition, entry)
            if record is not None:
                due.append((record, entry[1], entry[2]))
        return due

    def _open_record(self, partition: int, entry: _Due) -> GroupRecord | None:
        """The record of a heap entry's group, if that group is still open with that opening
        (a stale entry costs no table read)."""
        if self._open_due.get(entry[2]) != (partition, entry[0]):
            return None
        record = self._groups.get(entry[2])
        if record is None or record["closed_ms"]:
            return None
        return record

    def _count(self, verdict: Verdict) -> None:
        if verdict is Verdict.KEEP:
            self._stats.kept += 1
        elif verdict is Verdict.FLAG:
            self._stats.failed_flagged += 1
        elif verdict is Verdict.DROP_FAILED:
            self._stats.failed_dropped += 1
        else:
            self._stats.stale += 1

    def _close(
        self,
        group_id: str,
        record: GroupRecord,
        *,
        now_ms: int,
        reason: str,
        last: dict[str, bytes] | None = None,
    ) -> ReadyGroup | None:
        """Close a group; `last` holds the payload of the sample that completed it (not in the
        payloads table)."""
        members = sorted(record["members"].items(), key=lambda kv: (kv[1][0], kv[0]))
        trainable = [(tid, m) for tid, m in members if Verdict(m[1]).trainable]
        last = last or {}
        payloads = [last[tid] if tid in last else self._pop_payload(tid) for tid, _ in trainable]
        record["closed_ms"] = max(now_ms, 1)  # 0 means open
        self._groups[group_id] = record
        self._push(self._closed, record["partition"], record["closed_ms"], group_id)
        self._open_due.pop(group_id, None)
        group = ReadyGroup(
            group_id=group_id,
            model_name=record["model_name"],
            task_type=record["task_type"],
            group_size=self.config.group_size,
            min_policy_version=min((m[2] for _, m in trainable), default=0),
            payloads=[p for p in payloads if p is not None],
            flagged_ids=[tid for tid, m in trainable if m[1] == Verdict.FLAG.value],
            closed_reason=reason,
        )
        return self._apply_partial_policy(group)

    def _apply_partial_policy(self, group: ReadyGroup) -> ReadyGroup | None:
        num_trainable = len(group.payloads)
        if num_trainable == 0:
            self._stats.groups_dropped += 1
            return None
        if num_trainable >= self.config.group_size:
            return group
        policy = self.config.partial_policy
        if policy is PartialPolicy.DROP or num_trainable < self.config.min_group_size:
            self._stats.groups_dropped += 1
            log_dropped(group.group_id, group.model_name,
                        f"partial ({num_trainable} of {self.config.group_size} trainable, "
                        f"policy {policy.value}, min_group_size {self.config.min_group_size})")
            return None
        if policy is PartialPolicy.PAD:
            group.pad_to = self.config.group_size
            self._stats.groups_padded += 1
        return group

    def _pop_payload(self, trajectory_id: str) -> bytes | None:
        payload = self._payloads.get(trajectory_id)
        if payload is not None:
            del self._payloads[trajectory_id]
        return payload


def _seen(record: GroupRecord, trajectory: Trajectory) -> bool:
    """The trajectory id, or its sample slot, is already a member of the group."""
    members = record["members"]
    return trajectory.trajectory_id in members or any(
        m[0] == trajectory.sample_index for m in members.values()
    )


def _new_record(trajectory: Trajectory, *, partition: int, now_ms: int, clock_ms: int) -> GroupRecord:
    return {
        "partition": partition,
        "opened_ms": now_ms,
        "opened_clock_ms": clock_ms,
        "closed_ms": 0,
        "model_name": trajectory.model_name,
        "task_type": trajectory.task_type,
        "members": {},
    }
