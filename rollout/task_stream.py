"""KafkaTaskSource: task groups from the `stacx.tasks` topic, shared by a consumer group.

Ownership follows the group's assignment. Per owned partition a worker keeps the tasks it took and
has not finished (`running`) and those finished above its commit point (`finished`). Every
finished task commits at once: the offset is the lowest unfinished one, the commit's metadata lists
the finished offsets above it (`encode_finished`), so whoever owns the partition next (a rebalance,
a restart) skips what was done and strands nothing behind a gap. A partition taken away drops its
not-yet-started look-ahead (`owns` turns False: the manager discards those groups); what was
running still publishes, but commits nothing there any more.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stacx.rollout.data import group_id_for
from stacx.rollout.protocols import TaskGroup
from stacx.schemas.records import TaskSample

__all__ = ["KafkaTaskSource", "PartitionProgress", "decode_finished", "encode_finished"]

log = logging.getLogger(__name__)

Partition = tuple[str, int]

FINISHED_PREFIX = "stacx.finished:"
"""Commit metadata written here: finished offsets above the committed one, as deltas from it."""
CLOSE_COMMIT_WAIT_S = 2.0
"""How long the last commit on close waits for a group coordinator that is away."""
METADATA_MAX_CHARS = 4000
"""Kafka's `offset.metadata.max.bytes` defaults to 4096: a longer list keeps its lowest offsets
(those left out run again under the next owner: duplicates, never a lost task)."""


def encode_finished(base: int, finished: Iterable[int]) -> str:
    """Commit metadata for the `finished` offsets above `base`, as ranges of deltas: `1-3,7`."""
    deltas = sorted(o - base for o in set(finished) if o > base)
    ranges: list[str] = []
    start = prev = None
    for delta in [*deltas, None]:
        if start is not None and delta == prev + 1:  # type: ignore[operator]
            prev = delta
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = delta
    text = FINISHED_PREFIX
    for part in ranges:
        if len(text) + len(part) + 1 > METADATA_MAX_CHARS:
            break
        text += ("," if text != FINISHED_PREFIX else "") + part
    return text


def decode_finished(base: int, metadata: str | None) -> set[int]:
    """The finished offsets that `encode_finished` wrote; nothing for foreign or damaged metadata."""
    if not metadata or not metadata.startswith(FINISHED_PREFIX) or base < 0:
        return set()
    finished: set[int] = set()
    for part in filter(None, metadata[len(FINISHED_PREFIX) :].split(",")):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            log.warning("commit metadata %r is not a finished-offsets list: ignored", metadata[:80])
            return set()
        finished.update(range(base + int(low), base + int(high or low) + 1))
    return finished


@dataclass(slots=True)
class PartitionProgress:
    """One owned partition: tasks taken and not finished, and finished ones not yet committed past."""

    running: dict[int, Any] = field(default_factory=dict)
    """offset -> the event of a task taken here and not finished."""
    finished: set[int] = field(default_factory=set)
    """Finished offsets (here, or by an earlier owner per the commit metadata) above the commit."""
    read_to: int | None = None
    """The offset after the last event read here (None: nothing read yet)."""
    floor: int = 0
    """Every offset below it is finished: the last commit point (a rebalance that keeps the
    partition here re-reads from an older committed one: those are not run again)."""

    def take(self, event: Any) -> bool:
        """Record `event` as read; True when it is a task to run (not running nor finished)."""
        offset = event.offset
        self.read_to = max(self.read_to or 0, offset + 1)
        if offset < self.floor or offset in self.running or offset in self.finished:
            return False
        self.running[offset] = event
        return True

    def finish(self, event: Any) -> bool:
        """Mark `event` finished; False when this partition's copy of the task is another one."""
        offset = event.offset
        if self.running.get(offset) is event:
            del self.running[offset]
        elif offset in self.running:
            return False
        self.finished.add(offset)
        return True

    def commit_point(self) -> tuple[int, str] | None:
        """(offset, metadata) to commit: the lowest unfinished offset read, or past all read."""
        if self.read_to is None:
            return None
        base = max(self.floor, min(self.running) if self.running else self.read_to)
        self.floor = base
        self.finished = {o for o in self.finished if o >= base}
        return base, encode_finished(base, self.finished)


class KafkaTaskSource:
    """Groups from the `stacx.tasks` topic through a consumer group (many workers share it).

    A task's offset is committed as finished once every sample of its group is published (`ack`),
    so a lost worker's unfinished tasks are redelivered to another one, and nothing finished is
    run again. `num_takeovers` counts rebalances that gave this worker partitions it did not have
    (a peer left); `num_revocations` those that took partitions away (a peer joined).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        bootstrap_servers: str
        """Kafka bootstrap servers."""
        group_id: str = "stacx-rollout"
        """Consumer group shared by the rollout workers."""
        topic: str = "stacx.tasks"
        """Topic of `TaskSample` events."""
        samples_per_task: int = 1
        """Samples per task: the GRPO group size `n`."""
        poll_timeout_s: float = 0.5
        """How long one poll waits for an event."""
        max_idle_polls: int = 0
        """Return `None` (exhausted) after this many empty polls in a row (0 = never)."""
        stranded_check_s: float = 30.0
        """Idle this long while wanting tasks, the worker asks the broker for its partitions' lag:
        unread tasks then are a stall, logged as an error and counted in `unread_tasks` (0 = never)."""

    def __init__(self, config: Config, consumer: Any = None) -> None:
        self.config = config
        self._lock = threading.Lock()
        """Guards `_progress`: rebalance callbacks run in the polling thread."""
        self._progress: dict[Partition, PartitionProgress] = {}
        self._assigned: set[Partition] = set()
        self._ever_assigned = False
        self._commit_lock = asyncio.Lock()
        self._idle = 0
        self._idle_since: float | None = None
        self._paused = False
        self._held: deque[Any] = deque()
        """Events a keep-alive poll returned (fetched before the pause took effect): served first."""
        self.num_takeovers = 0
        """Rebalances that assigned this worker partitions it did not have before (not the first)."""
        self.num_revocations = 0
        """Rebalances that took partitions away: their not-started tasks are no longer `owns`."""
        self.unread_tasks = 0
        """Tasks on this worker's partitions that it wants but polls do not return (a stall)."""
        self._closing = False
        self._consumer = consumer if consumer is not None else self._make_consumer()

    def _make_consumer(self) -> Any:
        from stacx.consumers import EventConsumer

        return EventConsumer(
            EventConsumer.Config(
                bootstrap_servers=self.config.bootstrap_servers,
                group_id=self.config.group_id,
                topics=[self.config.topic],
            ),
            on_assign=self.on_assign,
            on_revoke=self.on_revoke,
            on_lost=self.on_lost,
        )

    # -- rebalances (called from the polling thread) ------------------------------------------

    def on_revoke(self, partitions: list[Partition]) -> None:
        """Partitions are being taken away: commit where each stands, the last moment this
        member may (the next owner resumes there, skipping what finished here)."""
        if self._closing:  # leaving the group: every finished task was committed by its ack
            return
        with self._lock:
            positions = {p: self._progress[p].commit_point() for p in partitions if p in self._progress}
        self._commit({p: point for p, point in positions.items() if point is not None}, why="on revoke")

    def on_lost(self, partitions: list[Partition]) -> None:
        """The group gave these partitions to others already (this worker's session expired: a
        partition of the network, a long pause): forget them, commit nothing; their tasks not
        started here are dropped, and whatever owns them now re-runs the unfinished ones."""
        with self._lock:
            for part in partitions:
                self._progress.pop(part, None)
        self._assigned -= set(partitions)
        self.num_revocations += 1
        log.warning("partitions %s lost (the group moved on without this worker)", sorted(partitions))

    def on_assign(self, partitions: list[Partition]) -> None:
        """A new assignment: forget partitions no longer held (their look-ahead is dropped), load
        the finished offsets of the gained ones, count a takeover or a revocation."""
        assigned = set(partitions)
        gained, lost = assigned - self._assigned, self._assigned - assigned
        committed = self._committed(gained)
        with self._lock:
            for part in lost:
                self._progress.pop(part, None)
            for part in gained:
                offset, metadata = committed.get(part, (-1, ""))
                self._progress[part] = PartitionProgress(
                    finished=decode_finished(offset, metadata), floor=max(offset, 0)
                )
        if lost:
            self.num_revocations += 1
            log.info("partitions %s moved to other workers: tasks not started here dropped", sorted(lost))
        if gained and self._ever_assigned:
            self.num_takeovers += 1
            log.info("tasks of partitions %s re-served here (the group rebalanced)", sorted(gained))
        self._assigned, self._ever_assigned = assigned, True

    def _committed(self, partitions: set[Partition]) -> dict[Partition, tuple[int, str]]:
        if not partitions:
            return {}
        try:
            return dict(self._consumer.committed_positions(sorted(partitions)))
        except Exception as exc:  # ConsumerError: finished tasks may run again, none is lost
            log.warning("finished tasks of %s unknown (%s): those may run again", sorted(partitions), exc)
            return {}

    def owns(self, group: TaskGroup) -> bool:
        """Whether `group` still belongs to this worker (False once its partition moved)."""
        event = group.source_ref
        with self._lock:
            progress = self._progress.get((event.topic, event.partition))
            return progress is not None and progress.running.get(event.offset) is event

    # -- reading -------------------------------------------------------------------------------

    def keep_alive(self) -> None:
        """Serve the group while no task is wanted (the worker is full, or waits at its staleness
        bound): fetching paused, so nothing new is taken, but a rebalance completes at once
        instead of waiting for this member's next poll: a joining peer starts, a departed
        peer's tasks are re-served here (a takeover), in seconds, not after `max.poll.interval`."""
        if not self._paused:
            self._consumer.pause()
            self._paused = True
        event = self._consumer.poll(0)
        if event is not None:
            self._held.append(event)

    async def next_group(self) -> TaskGroup | None:
        if self._paused:
            await asyncio.to_thread(self._consumer.resume)
            self._paused = False
        while True:
            if self._held:
                event = self._held.popleft()
            else:
                event = await asyncio.to_thread(self._consumer.poll, self.config.poll_timeout_s)
            if event is not None and isinstance(event.value, TaskSample):
                self._idle, self._idle_since, self.unread_tasks = 0, None, 0
                if not self._take(event):
                    continue
                ref = f"{event.topic}/{event.partition}/{event.offset}"
                return TaskGroup(
                    group_id=group_id_for(event.value.task_id, 0, ref),
                    task=event.value,
                    num_samples=self.config.samples_per_task,
                    source_ref=event,
                )
            self._idle += 1
            if self.config.max_idle_polls and self._idle >= self.config.max_idle_polls:
                return None
            await self._check_stranded()

    async def _check_stranded(self) -> None:
        """After `stranded_check_s` of empty polls, unread tasks on the assigned partitions are a
        stall: say so (an error naming the partitions) and resume them, in case one was left
        paused; the check repeats every `stranded_check_s`."""
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        limit_s = self.config.stranded_check_s
        if not limit_s or now - self._idle_since < limit_s:
            return
        self._idle_since = now
        try:
            lag = await asyncio.to_thread(self._consumer.lag)
        except Exception as exc:  # ConsumerError, KafkaException: the broker is away; next time
            log.warning("could not read the tasks lag (%s)", exc)
            return
        unread = {part: n for part, n in lag.items() if n > 0}
        self.unread_tasks = sum(unread.values())
        if unread:
            log.error(
                "rollout worker stalled: %d unread tasks on %s, but polls return none for %.0f s; "
                "resuming those partitions",
                self.unread_tasks,
                ", ".join(f"{t}/{p} ({n})" for (t, p), n in sorted(unread.items())),
                limit_s,
            )
            await asyncio.to_thread(self._consumer.resume)

    def _take(self, event: Any) -> bool:
        """Whether `event` is a task to run here: its partition is held, it is neither running
        nor finished (a rebalance re-reads from the commit point)."""
        with self._lock:
            progress = self._progress.get((event.topic, event.partition))
            return progress is not None and progress.take(event)

    # -- commits -------------------------------------------------------------------------------

    async def ack(self, group: TaskGroup) -> None:
        """Every sample of `group` is published: commit its task as finished (where this worker
        still holds its partition; elsewhere the new owner's commits rule)."""
        event = group.source_ref
        part = (event.topic, event.partition)
        async with self._commit_lock:  # commits finish in order: a later one never goes backwards
            with self._lock:
                progress = self._progress.get(part)
                point = progress.commit_point() if progress is not None and progress.finish(event) else None
            if point is not None:
                await asyncio.to_thread(self._commit, {part: point}, why=f"after {event.value.task_id}")

    def _commit(
        self, positions: dict[Partition, tuple[int, str]], *, why: str, wait_s: float | None = None
    ) -> None:
        from stacx.consumers import ConsumerError

        if not positions:
            return
        try:
            self._consumer.commit_positions(positions, wait_s=wait_s)
        except ConsumerError as exc:  # the group moved on: the partition's next owner re-reads
            log.warning("commit %s not taken (%s): unfinished tasks are redelivered", why, exc)

    async def close(self) -> None:
        """Commit where every held partition stands, then leave the group."""
        with self._lock:
            points = {p: progress.commit_point() for p, progress in self._progress.items()}
        positions = {p: point for p, point in points.items() if point is not None}
        # short: when stopping, the brokers may be going too (a node, a Slurm job) and every
        # finished task was committed by its ack already
        await asyncio.to_thread(self._commit, positions, why="on close", wait_s=CLOSE_COMMIT_WAIT_S)
        self._closing = True
        await asyncio.to_thread(self._consumer.close)
