"""Figures per policy version, read off the run's own events (pure: no Kafka, no tracker).

- **trainer/** (at the version's arrival on the weights topic): the figures of the step that made
  it, from the `step.*` metadata the trainer puts on each `WeightVersion` (loss, each role's loss
  terms, KL, clip fraction, grad norm, tokens, step time), and tokens/s;
- **assembler/** (the same step): batches assembled since the previous version, their staleness
  and reward;
- **rollout/** (once the run has moved `settle_versions` past the version, or at the end): the
  episodes the version generated: reward mean/std overall, per task type and per reward
  component, success, tool use, failures, turns, tokens, staleness at arrival, and the share
  the assembler's filter drops; with a table of sample trajectories.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stacx.infra.tracking.protocols import Cell, Table
from stacx.schemas.records import (
    STEP_FIGURE_PREFIX,
    TrainingBatch,
    Trajectory,
    TrajectoryStatus,
    WeightVersion,
)

__all__ = [
    "SAMPLE_COLUMNS",
    "Point",
    "RunFigures",
    "figure_name",
    "rollout_figures",
    "sample_table",
    "trainer_figures",
]

SAMPLE_COLUMNS = (
    "trajectory_id",
    "task_id",
    "task_type",
    "reward",
    "status",
    "turns",
    "generated_tokens",
    "prompt",
    "answer",
)
"""Columns of the `trajectories` table."""
MAX_TEXT_CHARS = 400
"""Longest prompt or answer text in a table cell."""

Keeps = Callable[[Trajectory, int], bool]
"""Whether the assembler would put a trajectory in a batch, given the newest policy version."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- /]")
"""Characters some trackers refuse in a figure name (MLflow: alphanumerics, `_ - . / space`)."""


@dataclass(frozen=True, slots=True)
class Point:
    """Figures (and maybe a table) at one policy version."""

    step: int
    metrics: dict[str, float]
    table: Table | None = None


@dataclass(kw_only=True, slots=True)
class _Episodes:
    """The episodes of one generating version."""

    rewards: list[float] = field(default_factory=list)
    by_type: dict[str, list[float]] = field(default_factory=dict)
    components: dict[str, list[float]] = field(default_factory=dict)
    num_success: int = 0
    num_tool_use: int = 0
    num_failed: int = 0
    num_dropped: int = 0
    turns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    samples: list[Trajectory] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class _Batches:
    """Batches assembled since the last version."""

    num: int = 0
    staleness: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


class RunFigures:
    """Accumulates a run's events; `observe_weights` and `flush` hand out the `Point`s to log."""

    def __init__(
        self,
        *,
        settle_versions: int = 2,
        samples_per_version: int = 4,
        success_reward: float = 1.0,
        keeps: Keeps | None = None,
    ) -> None:
        self.settle_versions = settle_versions
        self.samples_per_version = samples_per_version
        self.success_reward = success_reward
        self._keeps = keeps
        self.newest = 0
        """Newest version published on the weights topic."""
        self.num_late = 0
        """Episodes of a version whose rollout figures were already logged (not in them)."""
        self._episodes: dict[int, _Episodes] = {}
        self._logged_through = -1
        """Rollout figures of every version up to this one are logged."""
        self._batches = _Batches()
        self._seen_ids: set[str] = set()

    def observe_trajectory(self, trajectory: Trajectory) -> None:
        if trajectory.trajectory_id in self._seen_ids:  # a redelivered event (ids are deterministic)
            return
        self._seen_ids.add(trajectory.trajectory_id)
        version = trajectory.policy_version
        if version <= self._logged_through:
            self.num_late += 1
            return
        episodes = self._episodes.setdefault(version, _Episodes())
        self._add(episodes, trajectory)

    def _add(self, episodes: _Episodes, trajectory: Trajectory) -> None:
        reward = float(trajectory.reward)
        episodes.rewards.append(reward)
        episodes.by_type.setdefault(trajectory.task_type, []).append(reward)
        for name, value in trajectory.rewards.items():
            episodes.components.setdefault(name, []).append(float(value))
        episodes.num_success += reward >= self.success_reward
        episodes.num_tool_use += _used_tool(trajectory)
        episodes.num_failed += trajectory.status in (TrajectoryStatus.FAILED, TrajectoryStatus.TIMED_OUT)
        if self._keeps is not None:
            episodes.num_dropped += not self._keeps(trajectory, self.newest)
        episodes.turns.append(sum(t.role == "assistant" for t in trajectory.turns))
        episodes.tokens.append(len(trajectory.token_ids))
        episodes.generated.append(int(trajectory.loss_mask.sum()))
        episodes.staleness.append(max(0, self.newest - trajectory.policy_version))
        if len(episodes.samples) < self.samples_per_version:
            episodes.samples.append(trajectory)

    def observe_batch(self, batch: TrainingBatch) -> None:
        self._batches.num += 1
        self._batches.staleness += [max(0, self.newest - int(v)) for v in batch.policy_versions]
        self._batches.rewards += [float(r) for r in batch.rewards]

    def observe_weights(self, version: WeightVersion) -> list[Point]:
        """The trainer's and assembler's figures of a new version, then the rollout figures that
        it settles; nothing for a version seen before (a re-announcement)."""
        if version.version <= self.newest:
            return []
        self.newest = version.version
        points = [Point(version.version, {**trainer_figures(version), **self._batch_figures()})]
        self._batches = _Batches()
        return points + self._rollout_points(through=self.newest - self.settle_versions)

    def flush(self) -> list[Point]:
        """Every rollout figure not logged yet (the run is over)."""
        return self._rollout_points(through=max(self._episodes, default=self._logged_through))

    def _rollout_points(self, *, through: int) -> list[Point]:
        points = []
        for version in sorted(v for v in self._episodes if v <= through):
            episodes = self._episodes.pop(version)
            points.append(Point(version, rollout_figures(episodes), sample_table(episodes.samples)))
        self._logged_through = max(self._logged_through, through)
        return points

    def _batch_figures(self) -> dict[str, float]:
        batches = self._batches
        figures = {"assembler/batches": float(batches.num)}
        if batches.staleness:
            figures["assembler/batch_staleness_mean"] = statistics.fmean(batches.staleness)
        if batches.rewards:
            figures["assembler/batch_reward_mean"] = statistics.fmean(batches.rewards)
        return figures


def trainer_figures(version: WeightVersion) -> dict[str, float]:
    """`trainer/<name>` for each `step.<name>` of the version's metadata, and tokens/s."""
    figures: dict[str, float] = {}
    for key, text in version.metadata.items():
        if key.startswith(STEP_FIGURE_PREFIX):
            value = _number(text)
            if value is not None:
                figures["trainer/" + figure_name(key.removeprefix(STEP_FIGURE_PREFIX))] = value
    seconds, tokens = figures.get("trainer/seconds"), figures.get("trainer/num_tokens")
    if seconds and tokens is not None:
        figures["trainer/tokens_per_s"] = tokens / seconds
    return figures


def rollout_figures(episodes: _Episodes) -> dict[str, float]:
    """`rollout/*` figures of one version's episodes."""
    n = len(episodes.rewards)
    figures = {
        "rollout/episodes": float(n),
        **_spread("rollout/reward", episodes.rewards),
        "rollout/success": episodes.num_success / n,
        "rollout/tool_use_rate": episodes.num_tool_use / n,
        "rollout/failed_rate": episodes.num_failed / n,
        "rollout/turns_mean": statistics.fmean(episodes.turns),
        "rollout/tokens_mean": statistics.fmean(episodes.tokens),
        "rollout/generated_tokens_mean": statistics.fmean(episodes.generated),
        "rollout/staleness_mean": statistics.fmean(episodes.staleness),
        "rollout/staleness_max": float(max(episodes.staleness)),
        "assembler/dropped_rate": episodes.num_dropped / n,
    }
    for task_type, rewards in sorted(episodes.by_type.items()):
        prefix = f"rollout/{figure_name(task_type)}"
        figures |= {**_spread(f"{prefix}/reward", rewards), f"{prefix}/episodes": float(len(rewards))}
    for name, values in sorted(episodes.components.items()):
        figures[f"rollout/rewards/{figure_name(name)}_mean"] = statistics.fmean(values)
    return figures


def _spread(prefix: str, values: list[float]) -> dict[str, float]:
    return {f"{prefix}_mean": statistics.fmean(values), f"{prefix}_std": statistics.pstdev(values)}


def sample_table(samples: Iterable[Trajectory]) -> Table:
    """Sample episodes, one row each (`SAMPLE_COLUMNS`)."""
    rows: list[list[Cell]] = [
        [
            t.trajectory_id,
            t.task_id,
            t.task_type,
            float(t.reward),
            str(t.status),
            sum(turn.role == "assistant" for turn in t.turns),
            int(t.loss_mask.sum()),
            _text(t, "user", first=True),
            _text(t, "assistant", first=False),
        ]
        for t in samples
    ]
    return Table(columns=SAMPLE_COLUMNS, rows=rows)


def _text(trajectory: Trajectory, role: str, *, first: bool) -> str:
    texts = [turn.text for turn in trajectory.turns if turn.role == role]
    text = (texts[0] if first else texts[-1]) if texts else ""
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


def _used_tool(trajectory: Trajectory) -> bool:
    counted = trajectory.metadata.get("num_tool_calls")
    if counted is not None and counted.isdigit():
        return int(counted) > 0
    return any(turn.tool_calls for turn in trajectory.turns)


def figure_name(name: str) -> str:
    """`name` with the characters some trackers refuse replaced by `_`."""
    return _UNSAFE.sub("_", name)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
