"""Per-sample decisions: validity, failure policy and staleness."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from stacx.consumers.assembly.errors import AssemblyConfigError
from stacx.consumers.assembly.protocols import LatestVersions
from stacx.schemas.records import Trajectory, TrajectoryStatus
from stacx.schemas.validation import record_problems

__all__ = ["FailurePolicy", "SampleFilter", "Verdict", "invalid_reason", "oldest_policy_version"]


class FailurePolicy(enum.StrEnum):
    DROP = "drop"
    """Failed samples never reach a batch."""
    FLAG = "flag"
    """Failed samples are packed as they are and listed in the batch metadata (`flagged`)."""
    MASK = "mask"
    """Failed samples are packed with an all-zero loss mask and listed in the metadata."""


class Verdict(enum.StrEnum):
    KEEP = "keep"
    FLAG = "flag"
    DROP_FAILED = "drop_failed"
    DROP_STALE = "drop_stale"

    @property
    def trainable(self) -> bool:
        return self in (Verdict.KEEP, Verdict.FLAG)


def oldest_policy_version(trajectory: Trajectory) -> int:
    """The oldest weight version that produced any of the sample's tokens."""
    turn_versions = [t.policy_version for t in trajectory.turns if t.policy_version is not None]
    return min([trajectory.policy_version, *turn_versions])


def invalid_reason(trajectory: Trajectory, vocab_size: int | None = None) -> str | None:
    """Why the sample cannot be packed (the shared record invariants, and token ids inside
    `vocab_size` when it is given), or None when it can."""
    problems = record_problems(trajectory)
    if not trajectory.group_id:
        problems.append("group_id is empty")
    ids = np.asarray(trajectory.token_ids)
    if vocab_size is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = sorted(set(ids[(ids < 0) | (ids >= vocab_size)].tolist()))[:5]
        problems.append(f"token ids {bad} are outside the vocabulary [0, {vocab_size}) of "
                        "filtering.vocab_size (tokenized for another model)")
    return "; ".join(problems) or None


class SampleFilter:
    """Decides whether one sample is trainable, flagged, failed or too stale."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        failure_policy: FailurePolicy = FailurePolicy.DROP
        """What happens to samples whose status is not in `ok_statuses`: drop, flag or mask."""
        ok_statuses: tuple[TrajectoryStatus, ...] = (TrajectoryStatus.COMPLETED,)
        """Statuses that count as successful episodes (COMPLETED, TRUNCATED, FAILED, TIMED_OUT, ...)."""
        max_staleness: int | None = 4
        """Largest allowed lag (latest policy version minus the sample's); None: no limit."""
        vocab_size: int | None = None
        """Vocabulary size of the trained model: a sample with a token id outside [0, vocab_size)
        is dead-lettered (None: not checked)."""

        def __post_init__(self) -> None:
            self.failure_policy = FailurePolicy(self.failure_policy)
            self.ok_statuses = tuple(self.ok_statuses)
            if self.max_staleness is not None and self.max_staleness < 0:
                raise AssemblyConfigError(
                    f"filtering.max_staleness must be >= 0 or null, got {self.max_staleness}"
                )
            if self.vocab_size is not None and self.vocab_size < 1:
                raise AssemblyConfigError(
                    f"filtering.vocab_size must be >= 1 or null, got {self.vocab_size}"
                )

    def __init__(self, config: Config, latest_versions: LatestVersions) -> None:
        self.config = config
        self._latest = latest_versions

    def lag(self, model_name: str, policy_version: int) -> int:
        """Versions between the sample and the newest published weights (0 if none seen)."""
        latest = self._latest.get(model_name)
        return 0 if latest is None else max(0, int(latest) - policy_version)

    def is_stale(self, model_name: str, policy_version: int) -> bool:
        limit = self.config.max_staleness
        return limit is not None and self.lag(model_name, policy_version) > limit

    def verdict(self, trajectory: Trajectory) -> Verdict:
        if self.is_stale(trajectory.model_name, oldest_policy_version(trajectory)):
            return Verdict.DROP_STALE
        if trajectory.status in self.config.ok_statuses:  # a StrEnum or its plain-string value
            return Verdict.KEEP
        if self.config.failure_policy is FailurePolicy.DROP:
            return Verdict.DROP_FAILED
        return Verdict.FLAG
