"""`ReadyBatchSource`: rewarded trajectories in, a `TrainingBatch` out whenever readiness fires.

It is the online learner's `BatchSource`: the trainer polls it like any source, commits its
positions only after the checkpoint of the step that used them, and seeks it back on resume.
Before a batch is handed out, its manifest (trajectory, interaction and feedback ids, offsets)
is written to the ledger; the checkpoint's trained batch ids select which manifests were
trained, so the audit of what was trained survives any crash.

The trajectories topic must have one partition (the join creates it so): a batch is a prefix
of what is pending, so one offset says what is consumed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stacx.consumers.assembly.packing import PackedGroup, pack_batch
from stacx.consumers.protocols import EventSource
from stacx.schemas.records import TrainingBatch, Trajectory
from stacx.trainer.errors import ConfigError
from stacx.trainer.oncall.readiness import ReadinessPolicy
from stacx.trainer.protocols import Positions, SourcedBatch
from stacx.trainer.sources import commit_positions

__all__ = ["Ledger", "ReadyBatchSource", "TrajectoryEvents"]

log = logging.getLogger(__name__)


class TrajectoryEvents(EventSource, Protocol):
    """What the source needs from `EventConsumer` (or `InMemoryConsumer` in tests)."""

    def seek(self, topic: str, partition: int, offset: int) -> None: ...


class Ledger:
    """One JSON manifest per batch handed out (`<root>/<batch_id>.json`, written atomically)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def write(self, batch_id: str, manifest: dict[str, Any]) -> None:
        path = self.root / f"{batch_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest))
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        tmp.replace(path)

    def read(self, batch_id: str) -> dict[str, Any] | None:
        path = self.root / f"{batch_id}.json"
        return dict(json.loads(path.read_text())) if path.is_file() else None

    def trained(self, batch_ids: Iterable[str]) -> list[dict[str, Any]]:
        """Manifests of the given (trained) batches, in order; a missing one is an error."""
        out = []
        for batch_id in batch_ids:
            manifest = self.read(batch_id)
            if manifest is None:
                raise ConfigError(f"ledger {self.root} has no manifest for trained batch {batch_id}")
            out.append(manifest)
        return out


@dataclass(slots=True)
class _Pending:
    trajectory: Trajectory
    topic: str
    partition: int
    offset: int
    arrived: float


class ReadyBatchSource:
    """See the module docstring."""

    def __init__(
        self,
        consumer: TrajectoryEvents,
        readiness: ReadinessPolicy,
        ledger: Ledger,
        *,
        model_name: str,
        trained_trajectory_ids: Iterable[str] = (),
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consumer = consumer
        self.readiness = readiness
        self.ledger = ledger
        self.model_name = model_name
        self.stop = stop or threading.Event()
        self.clock = clock
        self._done = set(trained_trajectory_ids)
        self._pending: list[_Pending] = []
        self.num_duplicates = 0
        """Trajectories skipped because they were already trained or pending (redelivered)."""
        self.num_rejected = 0
        """Batches the trainer set aside (see `reject`)."""

    def poll(self, timeout_s: float) -> SourcedBatch | None:
        for event in self.consumer.consume(500, timeout_s):
            self._add(event)
        if not self._pending:
            return None
        reason = self.readiness.reason(len(self._pending), self.clock() - self._pending[0].arrived)
        return self._batch(reason) if reason else None

    def _add(self, event: Any) -> None:
        if not isinstance(event.value, Trajectory):
            log.warning(
                "skipping %s at %s/%s@%s: not a Trajectory",
                type(event.value).__name__,
                event.topic,
                event.partition,
                event.offset,
            )
            return
        if event.partition != 0:
            raise ConfigError(
                f"{event.topic} has more than one partition: the online learner needs "
                "a single-partition trajectories topic (the join creates it so)"
            )
        tid = event.value.trajectory_id
        if tid in self._done:
            self.num_duplicates += 1
            return
        self._done.add(tid)
        self._pending.append(_Pending(event.value, event.topic, event.partition, event.offset, self.clock()))

    def _batch(self, reason: str) -> SourcedBatch:
        limit = self.readiness.config.max_trajectories
        taken, self._pending = self._pending[:limit], self._pending[limit:]
        trajectories = [p.trajectory for p in taken]
        batch = self.pack(trajectories, reason)
        last = taken[-1]
        self.ledger.write(batch.batch_id, _manifest(batch, trajectories, last.topic, last.offset, reason))
        return SourcedBatch(batch=batch, topic=last.topic, partition=last.partition, offset=last.offset)

    def pack(self, trajectories: list[Trajectory], reason: str) -> TrainingBatch:
        """One batch, one group: advantages are relative to the batch's mean reward."""
        group = PackedGroup(
            group_id=f"oncall:{trajectories[0].trajectory_id}",
            trajectories=trajectories,
            group_size=len(trajectories),
        )
        batch = pack_batch([group], model_name=self.model_name)
        batch.metadata["readiness"] = reason
        return batch

    def commit(self, positions: Positions) -> None:
        commit_positions(self.consumer, positions)  # refused: redelivered trajectories are known by id

    def seek(self, positions: Positions) -> None:
        for key, offset in positions.items():
            topic, partition = key.rsplit("/", 1)
            self.consumer.seek(topic, int(partition), offset)

    def reject(self, sourced: SourcedBatch, error: Exception) -> None:
        """A batch the trainer cannot use: logged and counted; training goes on, and its
        offsets are committed with the next checkpoint like any other batch's."""
        self.num_rejected += 1
        log.error("online batch %s set aside: %s", sourced.batch.batch_id, error)

    @property
    def exhausted(self) -> bool:
        return self.stop.is_set()

    def close(self) -> None:
        self.consumer.close()


def _manifest(
    batch: TrainingBatch, trajectories: list[Trajectory], topic: str, offset: int, reason: str
) -> dict[str, Any]:
    def ids(t: Trajectory, key: str) -> list[str]:
        return [i for i in t.metadata.get(key, "").split(",") if i]

    return {
        "batch_id": batch.batch_id,
        "readiness": reason,
        "topic": topic,
        "last_offset": offset,
        "trajectory_ids": [t.trajectory_id for t in trajectories],
        "interaction_ids": [i for t in trajectories for i in ids(t, "interaction_ids")],
        "feedback_ids": [i for t in trajectories for i in ids(t, "feedback_ids")],
        "first_feedback_ms": [int(t.metadata.get("first_feedback_ms", "0")) for t in trajectories],
        "rewards": [float(t.reward) for t in trajectories],
    }
