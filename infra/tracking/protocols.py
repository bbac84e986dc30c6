"""The tracker seam: what an experiment tracker is handed by a run, and what it is built from.

A tracker is built once per run as `factory(run: TrackedRun, **options)` and then receives, from one
thread, the run's configuration, its figures and its tables; `finish(outcome)` ends it. A tracker
may also have `log_summary(step, metrics)`: the run's headline figures (the last version with
enough episodes), called once before `finish`. Steps are policy
versions. Each figure name gets increasing steps, but names of different families are logged at
different times (a version's trainer figures as soon as it is published, its rollout figures once
they are settled), so one call may carry a step lower than an earlier call's; and a name may be
logged again at a step (a late episode revised the version's row): the last value is the figure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["Cell", "Outcome", "Table", "TrackedRun", "Tracker", "TrackerFactory"]

Cell = str | int | float
"""One table cell."""
Outcome = Literal["finished", "failed", "killed"]
"""How a run ended: done, stopped by an error, or stopped by a signal (Ctrl-C, SIGTERM)."""


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
    """`<name>-<UTC stamp>`: the tracker's run name and id, the same as the run's topics and
    groups. A second run of the same name has another id: it becomes another run beside the first."""
    dir: Path
    """This tracker's own folder, `runs/<name>/tracking/<tracker>/`, shared by every run of the
    name (kept when the name runs again): a tracker keeps each run apart in it by `run_id`."""


@runtime_checkable
class Tracker(Protocol):
    """An experiment tracker fed by the run (TensorBoard, W&B, MLflow, or a plug-in)."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's whole configuration (nested mappings of plain values), once, first."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Figures at policy version `step`, named `family/figure` (`rollout/reward_mean`)."""

    def log_table(self, name: str, step: int, table: Table) -> None:
        """A table at policy version `step` (`trajectories`: sample episodes of that version)."""

    def finish(self, outcome: Outcome = "finished") -> None:
        """Mark the run `outcome`, write everything out and close; nothing is logged after it.
        (A plug-in's `finish()` without the argument is called without it.)"""


TrackerFactory = Callable[..., Tracker]
"""What a config names: `factory(run: TrackedRun, **options) -> Tracker`."""
