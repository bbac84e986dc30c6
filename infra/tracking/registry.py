"""The `trackers` extension point: shipped trackers, dotted paths and `stacx.trackers` entry points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stacx.infra.tracking.errors import MissingTrackerPackage, TrackingError
from stacx.infra.tracking.mlflow_tracker import MlflowTracker
from stacx.infra.tracking.protocols import TrackedRun, Tracker, TrackerFactory
from stacx.infra.tracking.requirements import Requirement
from stacx.infra.tracking.tensorboard_tracker import TensorBoardTracker
from stacx.infra.tracking.wandb_tracker import WandbTracker
from stacx.schemas.plugins import PluginError, Registry, accepts

__all__ = ["TRACKERS", "build_tracker", "tracker_problem"]


def _check(obj: Any) -> str | None:
    return None if callable(obj) else f"is a {type(obj).__name__}, not a callable factory(run, **options)"


TRACKERS: Registry[TrackerFactory] = Registry("trackers", what="tracker", check=_check)
"""`factory(run: TrackedRun, **options) -> Tracker` by name."""
TRACKERS.add("tensorboard", TensorBoardTracker, origin="builtin (stacx.infra.tracking)")
TRACKERS.add("wandb", WandbTracker, origin="builtin (stacx.infra.tracking)")
TRACKERS.add("mlflow", MlflowTracker, origin="builtin (stacx.infra.tracking)")

_PROBE = TrackedRun(name="run", run_id="run-0", dir=Path("."))
"""Stands for the run when a factory's signature is checked before the run exists."""


def tracker_problem(name: str, options: dict[str, Any]) -> str | None:
    """Why `name` with `options` cannot be built (unknown, not installed, options that do not
    fit its signature), in one line; None when it can. Imports a dotted path, builds nothing."""
    try:
        factory = TRACKERS.resolve(name)
    except PluginError as exc:
        return str(exc)
    requirement = getattr(factory, "requires", None)
    if isinstance(requirement, Requirement) and (missing := requirement.missing()):
        return missing
    problem = accepts(factory, _PROBE, **options)
    return f"{name!r}: options do not fit: {problem}" if problem else None


def build_tracker(name: str, options: dict[str, Any], run: TrackedRun) -> Tracker:
    """The tracker `name` names, built for `run`; `TrackingError` with one line otherwise."""
    try:
        tracker: Tracker = TRACKERS.build(name, run, **options)
    except PluginError as exc:
        cause = exc.__cause__
        if isinstance(cause, MissingTrackerPackage):
            raise MissingTrackerPackage(str(cause)) from cause
        raise TrackingError(str(exc)) from exc
    return tracker
