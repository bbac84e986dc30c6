"""What a benchmark suite adapter is: the seam `stacx bench` runs every suite through.

A suite adapter reads the suite as its authors publish it (a Harbor dataset folder, a JSONL or
Parquet file, a git checkout) from a local path, turns it into `TaskSample`s, names the scaffold
and the reward the suite defines, and computes the suite's own metric from every episode's
reward components.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from stacx.schemas.records import TaskSample

__all__ = ["BenchmarkSuite", "LoadedSuite", "SuiteScore", "TaskOutcome"]


@dataclass(frozen=True, slots=True)
class LoadedSuite:
    """The tasks of one suite copy, and one line for each row or task that could not be used."""

    tasks: list[TaskSample]
    problems: list[str] = field(default_factory=list)
    """`file:line: what is wrong and the fix`, one per skipped row or task."""

    def readiness(self, empty: str) -> list[str]:
        """What `prepare` reports: the problems, or `empty` alone when the copy held nothing."""
        return [empty] if not self.tasks and not self.problems else self.problems


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """Every sample of one task: the reward components of each episode, in the order they ended."""

    task_id: str
    samples: list[dict[str, float]]
    group: str = ""
    """The level or difficulty the suite reports separately (`level1`, `Level 3`, `hard`); empty: none."""


@dataclass(frozen=True, slots=True)
class SuiteScore:
    """A suite's metric over a run, with its 95 % interval, and the per-task values behind it."""

    metric: str
    """The suite's headline metric (`accuracy`, `resolved rate`, `AlgoTune score`, ...)."""
    value: float
    interval: tuple[float, float]
    interval_method: str
    """`wilson` (a rate) or `bootstrap` (a speedup)."""
    extra: dict[str, float] = field(default_factory=dict)
    """Further suite figures (`pass@4`, `mean speedup`, ...)."""
    per_task: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per task id: the values the table shows and the metric is computed from."""


@runtime_checkable
class BenchmarkSuite(Protocol):
    """One benchmark suite; `stacx bench list` shows `name`, `metric` and `layout`."""

    name: str
    """The name `stacx bench` takes (`gsm8k`, `terminal-bench-2`)."""
    metric: str
    """What the suite reports, in a few words."""
    layout: str
    """The input it reads, in a few words (`Harbor task folders`, `JSONL: question, answer`)."""
    task_type: str
    """The task type its tasks carry: the evaluator of that name runs them."""
    scaffold: str
    """The scaffold the suite is run with unless the config has an evaluator of `task_type`."""
    reward: str
    """The reward the suite defines (always used)."""

    def prepare(self, path: Path) -> list[str]:
        """What is missing or malformed in the copy at `path`: one line each (empty: ready)."""
        ...

    def load(self, path: Path) -> LoadedSuite:
        """The suite's tasks; a malformed row or task is skipped with one line."""
        ...

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        """The suite's metric over `outcomes` (best-of-`k` figures where the suite has them)."""
        ...
