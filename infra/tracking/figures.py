"""Figures per policy version, read off the run's own events (pure: no Kafka, no tracker).

- **trainer/** (at the version's arrival on the weights topic): the figures of the step that made
  it, from the `step.*` metadata the trainer puts on each `WeightVersion` (loss, each role's loss
  terms, KL, clip fraction, grad norm, tokens, step time), and tokens/s;
- **assembler/** (the same step): batches assembled since the previous version, their staleness
  and reward;
- **perf/** (the same step): episodes read per second since the previous version;
- **rollout/** (once the run has moved `settle_versions` past the version, revised when a late
  episode of it arrives, and at the end): the episodes the version generated: their count,
  reward mean/std overall, per task type and per reward component, success, tool use, failures,
  turns, tokens, response lengths and truncation, staleness at arrival (the newest version live
  at the episode's Kafka timestamp), and the share the assembler's filter drops; with a table of
  sample trajectories.
"""

from __future__ import annotations

import bisect
import itertools
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
    num_truncated: int = 0
    num_dropped: int = 0
    turns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)
    """Wall time of each episode that says it (`duration_ms` metadata of the rollout)."""
    arrivals: list[int] = field(default_factory=list)
    """Kafka timestamp (ms) of each episode: its staleness is the newest version live then."""
    samples: list[Trajectory] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class _Batches:
    """Batches assembled since the last version."""

    num: int = 0
    staleness: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)
    """Per batch: from its newest trajectory's event to its own (Kafka timestamps)."""


class _Timeline:
    """When each policy version went live: (Kafka timestamp, version) of the weight versions and of
    the episodes (an episode of version v shows v was live). `live_at(t)` is the newest by then."""

    def __init__(self) -> None:
        self._marks: list[tuple[int, int]] = []
        self._sorted = True
        self._prefix: list[int] = []

    def add(self, timestamp_ms: int, version: int) -> None:
        self._marks.append((timestamp_ms, version))
        self._sorted = False

    def live_at(self, timestamp_ms: int) -> int:
        if not self._sorted:
            self._marks.sort()
            self._prefix = list(itertools.accumulate((v for _, v in self._marks), max))
            self._sorted = True
        index = bisect.bisect_right(self._marks, (timestamp_ms, math.inf)) - 1
        return self._prefix[index] if index >= 0 else 0


class RunFigures:
    """Accumulates a run's events; `observe_weights` and `flush` hand out the `Point`s to log.

    A version's rollout figures are first logged once it is settled (the trainer is
    `settle_versions` versions further); an episode of it that arrives later revises the row
    (logged again at the same step, with its episode count), so the last value at each step is
    the figure of every episode of that version on the topic."""

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
        """Newest version settled (its trainer figures logged)."""
        self.num_revised = 0
        """Episodes that arrived after their version's rollout figures were first logged."""
        self._episodes: dict[int, _Episodes] = {}
        self._logged: dict[int, dict[str, float]] = {}
        """The rollout figures last logged per version."""
        self._settled_through = -1
        self._timeline = _Timeline()
        self._batches = _Batches()
        self._since_ms: int | None = None
        """Kafka timestamp of the previous settled version (for episodes/s)."""
        self._num_arrived = 0
        """Episodes read since the previous settled version."""
        self._published_ms: dict[int, int] = {}
        self._swapped_ms: dict[int, int] = {}
        self._swaps_logged: set[int] = set()
        self._arrived_ms: dict[str, int] = {}
        """Kafka timestamp of each episode read, by trajectory id (redeliveries counted once)."""

    def note_published(self, version: int, timestamp_ms: int) -> None:
        """A weight version was read off the topic (before it settles): it was live from then."""
        self._timeline.add(timestamp_ms, version)
        self._published_ms.setdefault(version, timestamp_ms)

    def note_swap(self, version: int, seen_ms: int) -> None:
        """The inference server was first seen serving `version` at `seen_ms` (epoch ms)."""
        self._swapped_ms.setdefault(version, seen_ms)

    def swap_points(self) -> list[Point]:
        """`perf/publish_to_swap_s` of each version whose publish and swap are both known now
        (each once): from its event on the weights topic to the server serving it."""
        points = []
        for version in sorted(set(self._published_ms) & set(self._swapped_ms) - self._swaps_logged):
            delay_s = max(0, self._swapped_ms[version] - self._published_ms[version]) / 1000
            points.append(Point(version, {"perf/publish_to_swap_s": delay_s}))
            self._swaps_logged.add(version)
        return points

    def observe_trajectory(self, trajectory: Trajectory, timestamp_ms: int | None = None) -> None:
        """An episode, with the Kafka timestamp it arrived with (default: when it was created)."""
        if trajectory.trajectory_id in self._arrived_ms:  # a redelivered event (ids are deterministic)
            return
        arrived = trajectory.created_at_ms if timestamp_ms is None else timestamp_ms
        self._arrived_ms[trajectory.trajectory_id] = arrived
        self._timeline.add(arrived, trajectory.policy_version)
        self._num_arrived += 1
        if trajectory.policy_version in self._logged:
            self.num_revised += 1
        episodes = self._episodes.setdefault(trajectory.policy_version, _Episodes())
        self._add(episodes, trajectory, arrived)

    def _add(self, episodes: _Episodes, trajectory: Trajectory, arrived: int) -> None:
        reward = float(trajectory.reward)
        episodes.rewards.append(reward)
        episodes.by_type.setdefault(trajectory.task_type, []).append(reward)
        for name, value in trajectory.rewards.items():
            episodes.components.setdefault(name, []).append(float(value))
        episodes.num_success += reward >= self.success_reward
        episodes.num_tool_use += _used_tool(trajectory)
        episodes.num_failed += trajectory.status in (TrajectoryStatus.FAILED, TrajectoryStatus.TIMED_OUT)
        episodes.num_truncated += trajectory.status == TrajectoryStatus.TRUNCATED
        if self._keeps is not None:
            episodes.num_dropped += not self._keeps(trajectory, self.newest)
        episodes.turns.append(sum(t.role == "assistant" for t in trajectory.turns))
        episodes.tokens.append(len(trajectory.token_ids))
        episodes.generated.append(int(trajectory.loss_mask.sum()))
        episodes.arrivals.append(arrived)
        duration = _number(trajectory.metadata.get("duration_ms", ""))
        if duration is not None:
            episodes.durations_s.append(duration / 1000)
        if len(episodes.samples) < self.samples_per_version and trajectory.policy_version not in self._logged:
            episodes.samples.append(trajectory)

    def observe_batch(self, batch: TrainingBatch, timestamp_ms: int | None = None) -> None:
        """A batch, with the Kafka timestamp it was published with (for the assembly wait)."""
        members = [self._arrived_ms[t] for t in batch.trajectory_ids if t in self._arrived_ms]
        if timestamp_ms is not None and members:
            self._batches.waits_s.append(max(0, timestamp_ms - max(members)) / 1000)
        self._batches.num += 1
        self._batches.staleness += [max(0, self.newest - int(v)) for v in batch.policy_versions]
        self._batches.rewards += [float(r) for r in batch.rewards]

    def observe_weights(self, version: WeightVersion, timestamp_ms: int | None = None) -> list[Point]:
        """The trainer's and assembler's figures of a newly settled version, then the rollout
        figures it settles or revises; nothing for a version seen before (a re-announcement)."""
        if version.version <= self.newest:
            return []
        self.newest = version.version
        if timestamp_ms is not None:
            self.note_published(version.version, timestamp_ms)
        figures = {**trainer_figures(version), **self._batch_figures(), **self._rate_figures(timestamp_ms)}
        self._batches = _Batches()
        settled = self._rollout_points(through=self.newest - self.settle_versions)
        return [Point(version.version, figures), *settled]

    def flush(self) -> list[Point]:
        """Every rollout figure not logged yet, or changed since it was (the run is over)."""
        return self._rollout_points(through=max(self._episodes, default=self._settled_through))

    def _rollout_points(self, *, through: int) -> list[Point]:
        self._settled_through = max(self._settled_through, through)
        points = []
        for version in sorted(v for v in self._episodes if v <= self._settled_through):
            episodes = self._episodes[version]
            staleness = [max(0, self._timeline.live_at(t) - version) for t in episodes.arrivals]
            figures = rollout_figures(episodes, staleness)
            if self._logged.get(version) == figures:
                continue
            table = None if version in self._logged else sample_table(episodes.samples)
            episodes.samples = []  # logged with the first row: the whole trajectories go
            self._logged[version] = figures
            points.append(Point(version, figures, table))
        return points

    def summary(self, min_episodes: int | None = None) -> Point | None:
        """The rollout figures of the newest version with at least `min_episodes` episodes
        (default: half the median count per version), so that a tail of a few late episodes of
        the last version is not the run's headline; None before any version is logged."""
        counts = {v: len(self._episodes[v].rewards) for v in self._logged}
        if not counts:
            return None
        floor = statistics.median(counts.values()) / 2 if min_episodes is None else min_episodes
        enough = [v for v, n in counts.items() if n >= floor] or list(counts)
        version = max(enough)
        return Point(version, dict(self._logged[version]))

    def _batch_figures(self) -> dict[str, float]:
        batches = self._batches
        figures = {"assembler/batches": float(batches.num)}
        if batches.staleness:
            figures["assembler/batch_staleness_mean"] = statistics.fmean(batches.staleness)
        if batches.rewards:
            figures["assembler/batch_reward_mean"] = statistics.fmean(batches.rewards)
        if batches.waits_s:
            figures["assembler/wait_s_mean"] = statistics.fmean(batches.waits_s)
        return figures

    def _rate_figures(self, timestamp_ms: int | None) -> dict[str, float]:
        """Episodes read since the previous version, per second between the two versions."""
        since, self._since_ms = self._since_ms, timestamp_ms
        arrived, self._num_arrived = self._num_arrived, 0
        if since is None or timestamp_ms is None or timestamp_ms <= since:
            return {}
        return {"perf/episodes_per_s": arrived * 1000.0 / (timestamp_ms - since)}


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


def rollout_figures(episodes: _Episodes, staleness: list[int]) -> dict[str, float]:
    """`rollout/*` figures of one version's episodes (`staleness`: each one's, at arrival).
    Length names follow verl's `response_length/*`."""
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
        "rollout/response_length/mean": statistics.fmean(episodes.generated),
        "rollout/response_length/max": float(max(episodes.generated)),
        "rollout/response_length/min": float(min(episodes.generated)),
        "rollout/response_length/clip_ratio": episodes.num_truncated / n,
        "rollout/staleness_mean": statistics.fmean(staleness),
        "rollout/staleness_max": float(max(staleness)),
        "assembler/dropped_rate": episodes.num_dropped / n,
    }
    if episodes.durations_s:  # the time per episode of the generation stage (model, tools, reward)
        figures["rollout/episode_s_mean"] = statistics.fmean(episodes.durations_s)
        figures["rollout/episode_s_max"] = max(episodes.durations_s)
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
