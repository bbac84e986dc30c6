"""Many learners on one stream: each reads the trajectories topic in a consumer group of its own.

Kafka hands every group every record, so a GRPO trainer (through the assembler's group), a
reward-model or value learner and an SFT learner that keeps only successful trajectories
(rejection sampling) read one topic at once, each at its own pace, each with its committed
offsets and visible lag (`stacx topics describe`, kafka-consumer-groups.sh).
`LearnerFeed` is the reading side of such a learner: a named group, a keep rule, and commits
only after the caller used what it was given.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from stacx.consumers.event_consumer import ConsumedEvent, EventConsumer
from stacx.schemas import topics
from stacx.schemas.records import Trajectory, TrajectoryStatus

__all__ = ["KeepRule", "LearnerFeed"]


class KeepRule(enum.StrEnum):
    ALL = "all"
    """Every trajectory (GRPO, reward or value models learn from failures too)."""
    SUCCESSFUL = "successful"
    """Completed trajectories with reward >= `min_reward` (SFT by rejection sampling)."""


class LearnerFeed:
    """One learner's view of a trajectories topic."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        group_id: str
        """The learner's consumer group, e.g. `stacx-sft-<run id>` (one per learner)."""
        topic: str = topics.TRAJECTORIES
        """Trajectories topic."""
        bootstrap_servers: str | None = None
        """Kafka bootstrap servers (default: $STACX_KAFKA, else 127.0.0.1:9092)."""
        keep: KeepRule = KeepRule.ALL
        """Which trajectories the learner is handed (the others are read and committed too)."""
        min_reward: float = 1.0
        """With keep=successful: the lowest reward that counts as a success."""
        consumer: dict[str, Any] = field(default_factory=dict)
        """Extra `EventConsumer.Config` fields (session timeout, dlq_topic, ...)."""

        def __post_init__(self) -> None:
            self.keep = KeepRule(self.keep)
            if not self.group_id:
                raise ValueError("LearnerFeed.Config.group_id is empty: give each learner its own group")

    def __init__(self, config: Config, *, source: EventConsumer | None = None) -> None:
        self.config = config
        self.num_seen = 0
        """Trajectories read (kept or not)."""
        self.num_kept = 0
        self._pending: list[ConsumedEvent] = []
        self._source = source or self._default_source()

    def _default_source(self) -> EventConsumer:
        extra: dict[str, Any] = (
            {"bootstrap_servers": self.config.bootstrap_servers} if self.config.bootstrap_servers else {}
        )
        return EventConsumer(
            EventConsumer.Config(
                group_id=self.config.group_id,
                topics=[self.config.topic],
                client_id=self.config.group_id,
                **extra,
                **self.config.consumer,
            ),
            expected=Trajectory,
        )

    def read(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Trajectory]:
        """The kept trajectories of the next poll; `commit()` once they are used."""
        events = self._source.consume(max_records, timeout_s)
        self._pending += events
        self.num_seen += len(events)
        kept = [e.value for e in events if self.keeps(e.value)]
        self.num_kept += len(kept)
        return kept

    def keeps(self, trajectory: Trajectory) -> bool:
        if self.config.keep is KeepRule.ALL:
            return True
        return trajectory.status is TrajectoryStatus.COMPLETED and trajectory.reward >= self.config.min_reward

    def commit(self) -> None:
        """Commit past everything read so far (kept or not)."""
        if self._pending:
            self._source.commit(self._pending)
            self._pending = []

    def lag(self) -> int | None:
        """Trajectories not yet read on this member's partitions; None while the group has
        assigned it none (0 would say "caught up" before it was given anything to read)."""
        if not self._source.assignment():
            return None
        return self._source.total_lag()

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> LearnerFeed:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
