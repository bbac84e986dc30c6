"""A run's curves, computed from what the view read: per policy version (reward, success,
staleness, tool use) from the trajectories topic, throughput over time, and the trainer's loss
and tokens per step from its log. Pure functions: unit-tested without services.

Staleness of a trajectory is how many policy versions it lags behind the newest version known
when it was written: the weights topic's versions up to its timestamp, and the versions of the
trajectories written before it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from stacx.infra.view.reader import TrajectorySummary, VersionPoint

__all__ = [
    "SUCCESS_REWARD",
    "TrainerStep",
    "VersionRow",
    "per_version",
    "read_trainer_steps",
    "staleness_of",
    "throughput",
    "tokens_per_s",
]

SUCCESS_REWARD = 1.0
"""An episode counts as a success when its reward reaches this (the full reward)."""

_STEP_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?trainer\.engine: step (?P<step>\d+) "
    r"batch (?P<batch>\S+) loss (?P<loss>\S+) tokens (?P<tokens>\d+)"
)
"""The trainer's line per optimizer step (`stacx.trainer.engine`, one per step on rank 0)."""


@dataclass(frozen=True, slots=True)
class VersionRow:
    """Training episodes of one policy version."""

    version: int
    episodes: int
    mean_reward: float
    reward_std: float
    success: float
    """Share of episodes whose reward reaches SUCCESS_REWARD."""
    tool_rate: float
    """Share of episodes with at least one tool call."""
    mean_staleness: float
    mean_tokens: float


@dataclass(frozen=True, slots=True)
class TrainerStep:
    """One optimizer step of the trainer's log."""

    step: int
    loss: float
    num_tokens: int
    time_s: float
    """Epoch seconds of the log line."""
    sft: bool
    """A warm-start (SFT) step rather than an RL one."""


def staleness_of(summaries: Sequence[TrajectorySummary], versions: Sequence[VersionPoint]) -> list[int]:
    """Per trajectory (in `summaries` order): newest known version at its timestamp minus its own."""
    marks = sorted(
        [(v.timestamp_ms, v.version) for v in versions]
        + [(s.timestamp_ms, s.policy_version) for s in summaries]
    )
    newest, i, out = 0, 0, {}
    for index in sorted(range(len(summaries)), key=lambda k: summaries[k].timestamp_ms):
        summary = summaries[index]
        while i < len(marks) and marks[i][0] <= summary.timestamp_ms:
            newest = max(newest, marks[i][1])
            i += 1
        out[index] = max(0, newest - summary.policy_version)
    return [out[k] for k in range(len(summaries))]


def per_version(summaries: Sequence[TrajectorySummary], versions: Sequence[VersionPoint]) -> list[VersionRow]:
    """One row per policy version that generated trajectories, in version order."""
    lags = staleness_of(summaries, versions)
    groups: dict[int, list[int]] = {}
    for index, summary in enumerate(summaries):
        groups.setdefault(summary.policy_version, []).append(index)
    rows = []
    for version, members in sorted(groups.items()):
        rewards = [summaries[k].reward for k in members]
        rows.append(
            VersionRow(
                version=version,
                episodes=len(members),
                mean_reward=statistics.fmean(rewards),
                reward_std=statistics.pstdev(rewards),
                success=statistics.fmean([float(r >= SUCCESS_REWARD) for r in rewards]),
                tool_rate=statistics.fmean([float(summaries[k].num_tool_calls > 0) for k in members]),
                mean_staleness=statistics.fmean([float(lags[k]) for k in members]),
                mean_tokens=statistics.fmean([float(summaries[k].num_tokens) for k in members]),
            )
        )
    return rows


def throughput(
    summaries: Sequence[TrajectorySummary], *, bucket_s: float | None = None
) -> list[tuple[float, float]]:
    """(seconds since the first trajectory, trajectories per second) per `bucket_s` window
    (default: the run's span in about 40 windows, 5 s at least)."""
    if not summaries:
        return []
    times = sorted(s.timestamp_ms / 1000.0 for s in summaries)
    start = times[0]
    if bucket_s is None:
        bucket_s = max(5.0, float(round((times[-1] - start) / 40)))
    counts: dict[int, int] = {}
    for t in times:
        bucket = int((t - start) // bucket_s)
        counts[bucket] = counts.get(bucket, 0) + 1
    last = max(counts)
    return [(b * bucket_s, counts.get(b, 0) / bucket_s) for b in range(last + 1)]


def _steps_of(lines: Iterable[str]) -> list[TrainerStep]:
    out = []
    for line in lines:
        m = _STEP_LINE.match(line)
        if m is None:
            continue
        try:
            loss = float(m["loss"])
            when = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        out.append(
            TrainerStep(
                step=int(m["step"]),
                loss=loss,
                num_tokens=int(m["tokens"]),
                time_s=when,
                sft=m["batch"].startswith("sft-"),
            )
        )
    return out


def read_trainer_steps(logs_dir: Path) -> list[TrainerStep]:
    """The trainer's steps from a run's logs: `trainer.log` (RL) and `pipeline.log` (warm start)."""
    steps: list[TrainerStep] = []
    for name in ("pipeline.log", "trainer.log"):
        try:
            with (logs_dir / name).open(errors="replace") as lines:
                steps += _steps_of(lines)
        except OSError:
            continue
    return steps


def tokens_per_s(steps: Sequence[TrainerStep]) -> list[tuple[int, float]]:
    """(step, trained tokens per second) from the time between consecutive step lines."""
    out = []
    for before, after in zip(steps, steps[1:], strict=False):
        gap = after.time_s - before.time_s
        if after.sft == before.sft and gap > 0:
            out.append((after.step, after.num_tokens / gap))
    return out
