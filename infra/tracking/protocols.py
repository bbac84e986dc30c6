"""The tracker seam: what an experiment tracker is handed by a run, and what it is built from.

A tracker is built once per run as `factory(run: TrackedRun, **options)` and then receives, from one
thread, the run's configuration, its figures and its tables; `finish()` ends it. Steps are policy
versions. Each figure name gets increasing steps, but names of different families are logged at
different times (a version's trainer figures as soon as it is published, its rollout figures once
they are complete), so one call may carry a step lower than an earlier call's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["Cell", "Table", "TrackedRun", "Tracker", "TrackerFactory"]

Cell = str | int | float
"""One table cell."""


@dataclass(frozen=True, slots=True)
class Table:
    """Rows under named columns (sample trajectories of one version, say)."""

    columns: Sequence[str]
    rows: Sequence[Sequence[Cell]]


@dataclass(frozen=True, slots=True)
class TrackedRun:
    """The run a tracker is built for."""

    name: str
    """Run name (`pipeline.name`): the project or experiment a tracker files the run under."""
    run_id: str
    """`<name>-<UTC stamp>`: the tracker's run name, the same as the run's topics and groups."""
    dir: Path
    """This tracker's own folder, `runs/<name>/tracking/<tracker>/`: all its files go here."""


@runtime_checkable
class Tracker(Protocol):
    """An experiment tracker fed by the run (TensorBoard, W&B, MLflow, or a plug-in)."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's whole configuration (nested mappings of plain values), once, first."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Figures at policy version `step`, named `family/figure` (`rollout/reward_mean`)."""

    def log_table(self, name: str, step: int, table: Table) -> None:
        """A table at policy version `step` (`trajectories`: sample episodes of that version)."""

    def finish(self) -> None:
        """Write everything out and close; nothing is logged after it."""


TrackerFactory = Callable[..., Tracker]
"""What a config names: `factory(run: TrackedRun, **options) -> Tracker`."""
