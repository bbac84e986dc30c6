"""Batch sources: in memory (tests, notebooks) and Kafka (live or replayed `stacx.batches`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from stacx.schemas.records import TrainingBatch
from stacx.trainer.batch import validate_batch
from stacx.trainer.config import SourceConfig
from stacx.trainer.errors import SourceError
from stacx.trainer.protocols import Positions, SourcedBatch

__all__ = ["InMemoryBatchSource", "KafkaBatchSource", "build_source", "commit_positions"]

log = logging.getLogger(__name__)


class InMemoryBatchSource:
    """A list of batches behaving like one Kafka partition (offsets = list indices).

    `committed` holds what a consumer group would have committed: tests assert on it.
    """

    def __init__(self, batches: Iterable[TrainingBatch], topic: str = "memory") -> None:
        self.batches = list(batches)
        self.topic = topic
        self.next_offset = 0
        self.committed: Positions = {}
        self.commit_calls = 0
        self.rejected: list[tuple[SourcedBatch, Exception]] = []
        """Batches the trainer set aside, with why (what would be dead letters on Kafka)."""

    def poll(self, timeout_s: float) -> SourcedBatch | None:
        if self.next_offset >= len(self.batches):
            return None
        offset = self.next_offset
        self.next_offset += 1
        return SourcedBatch(batch=self.batches[offset], topic=self.topic, partition=0,
                            offset=offset)

    def commit(self, positions: Positions) -> None:
        self.committed.update(positions)
        self.commit_calls += 1

    def seek(self, positions: Positions) -> None:
        self.next_offset = positions.get(f"{self.topic}/0", self.next_offset)

    def reject(self, sourced: SourcedBatch, error: Exception) -> None:
        self.rejected.append((sourced, error))

    @property
    def exhausted(self) -> bool:
        """True once every batch was handed out (the trainer then stops)."""
        return self.next_offset >= len(self.batches)

    def close(self) -> None:
        pass


class KafkaBatchSource:
    """TrainingBatches from a topic via the shared EventConsumer (manual commits only).

    Events the trainer cannot use (undecodable, another record type, a batch failing
    `validate_batch`, e.g. a NaN reward) go to `dlq_topic` with their reason and headers, are
    counted in `num_dead_letters`, and reading goes on.
    Replay: `replay_from_offset` / `replay_from_timestamp_ms` position every assigned partition
    before the first read; a checkpoint's positions (`seek`) take precedence over both.
    """

    def __init__(self, config: SourceConfig, client_id: str = "stacx-trainer") -> None:
        from stacx.consumers import EventConsumer

        self.config = config
        self._last_activity: float | None = None
        try:
            self.consumer: Any = EventConsumer(
                EventConsumer.Config(
                    bootstrap_servers=config.bootstrap_servers, group_id=config.group_id,
                    topics=[config.topic], client_id=client_id, dlq_topic=config.dlq_topic,
                    session_timeout_ms=config.session_timeout_ms,
                    max_poll_interval_ms=config.max_poll_interval_ms),
                validator=_validate_event, expected=TrainingBatch)
        except Exception as exc:
            raise SourceError(f"cannot consume {config.topic} at "
                              f"{config.bootstrap_servers}: {exc}") from exc
        self._floor: Positions = {}
        """Per partition, the offset below which events were already handed out (set when a
        commit is refused: the rejoined consumer reads again from the last commit)."""
        self._uncommitted: Positions | None = None
        """The positions of the last commit when the broker refused it."""
        self._replay_pending = config.replay_from_offset is not None
        if config.replay_from_timestamp_ms is not None:
            self.consumer.seek_to_timestamp(config.replay_from_timestamp_ms)

    def poll(self, timeout_s: float) -> SourcedBatch | None:
        if self._replay_pending:
            self._replay_pending = False
            offset = self.config.replay_from_offset
            assert offset is not None
            self._apply({f"{t}/{p}": offset for t, p in self._wait_for_assignment()})
        deadline = time.monotonic() + timeout_s
        while True:
            event = self.consumer.poll(timeout=max(0.0, deadline - time.monotonic()))
            if self._last_activity is None and self.consumer.assignment():
                self._last_activity = time.monotonic()  # the idle clock starts once assigned
            if event is None:
                return None
            self._last_activity = time.monotonic()
            if event.offset < self._floor.get(f"{event.topic}/{event.partition}", 0):
                continue  # read again after a refused commit: the trainer is past it
            return SourcedBatch(batch=event.value, topic=event.topic, partition=event.partition,
                                offset=event.offset, trace_context=event.trace_context,
                                key=event.key, headers=event.headers)

    @property
    def num_dead_letters(self) -> int:
        """Events set aside so far (by the consumer's checks or by `reject`)."""
        return int(self.consumer.num_dead_letters)

    def reject(self, sourced: SourcedBatch, error: Exception) -> None:
        from stacx.consumers import ConsumedEvent

        event = ConsumedEvent(sourced.batch, sourced.key, sourced.topic, sourced.partition,
                              sourced.offset, 0, dict(sourced.headers))
        self.consumer.dead_letter(event, error)

    @property
    def exhausted(self) -> bool:
        """True when partitions are assigned and nothing arrived for `idle_timeout_s`."""
        idle = self.config.idle_timeout_s
        return idle is not None and self._last_activity is not None and \
            time.monotonic() - self._last_activity >= idle

    def _wait_for_assignment(self, timeout_s: float = 30.0) -> list[tuple[str, int]]:
        """Join the group (events polled meanwhile are re-read after the following seek)."""
        deadline = time.monotonic() + timeout_s
        while not self.consumer.assignment():
            if time.monotonic() > deadline:
                raise SourceError(f"no partition of {self.config.topic} was assigned to group "
                                  f"{self.config.group_id!r} within {timeout_s:.0f}s")
            self.consumer.poll(timeout=0.2)
        return list(self.consumer.assignment())

    def _apply(self, positions: Positions) -> None:
        if len(positions) > 1:  # EventConsumer defers one seek only: be assigned first
            self._wait_for_assignment()
        for key, offset in positions.items():
            topic, partition = key.rsplit("/", 1)
            self.consumer.seek(topic, int(partition), offset)

    def commit(self, positions: Positions) -> None:
        """Commit `positions`. A commit the broker refuses because the group moved on (the
        trainer's session timed out while the broker restarted, say) does not stop training:
        the checkpoint already holds the positions, the next checkpoint commits them, and what
        the rejoined consumer reads again below them is dropped here, not handed out twice."""
        try:
            committed = commit_positions(self.consumer, positions)
        except Exception as exc:
            raise SourceError(f"committing {positions} failed: {exc}") from exc
        self._uncommitted = None if committed else dict(positions)
        if not committed:
            self._floor.update(positions)

    def seek(self, positions: Positions) -> None:
        self._replay_pending = False
        self._floor.clear()
        self._apply(positions)

    def close(self) -> None:
        """Close the consumer; positions whose commit was refused last are tried once more
        (the consumer has rejoined its group by now, unless the broker is still away)."""
        if self._uncommitted:
            with contextlib.suppress(SourceError):
                self.commit(self._uncommitted)
        self.consumer.close()


def commit_positions(consumer: Any, positions: Positions) -> bool:
    """Commit the next offsets `positions` through an EventConsumer-like `consumer`; False (and
    one warning) when the broker refused them because the group moved on since they were read."""
    from stacx.consumers import CommitRefusedError, ConsumedEvent

    # EventConsumer commits "past" events: describe each next offset as its predecessor
    events = [ConsumedEvent(None, None, key.rsplit("/", 1)[0], int(key.rsplit("/", 1)[1]),
                            offset - 1, 0) for key, offset in positions.items()]
    try:
        consumer.commit(events)
    except CommitRefusedError as exc:
        log.warning("%s; positions %s stay in the checkpoint, the next one commits them", exc, positions)
        return False
    return True


def _validate_event(record: object) -> None:
    """The trainer's own checks (`validate_batch`), run by the consumer on every batch event."""
    if isinstance(record, TrainingBatch):
        validate_batch(record)


def build_source(config: SourceConfig) -> KafkaBatchSource:
    """The Kafka source described by `config` (memory sources are passed in directly)."""
    if config.kind != "kafka":
        raise SourceError("source.kind=memory: pass `source=InMemoryBatchSource(...)` to "
                          "StacxTrainer; only `kafka` can be built from a config")
    return KafkaBatchSource(config)
