"""Experiment trackers fed from a run's own topics and the services' metrics endpoints.

A run names its trackers in `pipeline.tracking` (`[tensorboard, wandb, mlflow]`, or
`{name, options}` entries, or a `package.module:factory`, or an entry point in `stacx.trackers`);
each is a `Tracker` built as `factory(run, **options)`. One consumer thread of the orchestrator
(`TrackingFeed`, consumer group `stacx-tracking-<run id>`) turns trajectory, batch and
weight-version events and the servers' Prometheus figures into per-version figures
(`RunFigures`) and logs them to every tracker: no service knows trackers.
"""

from __future__ import annotations

from stacx.infra.tracking.config import TrackerSpec, TrackingConfig
from stacx.infra.tracking.errors import MissingTrackerPackage, TrackingError
from stacx.infra.tracking.feed import TrackingFeed
from stacx.infra.tracking.figures import Point, RunFigures
from stacx.infra.tracking.protocols import Cell, Table, TrackedRun, Tracker, TrackerFactory
from stacx.infra.tracking.registry import TRACKERS, build_tracker, tracker_problem
from stacx.infra.tracking.scrape import MetricsEndpoint
from stacx.infra.tracking.trackers import TrackerSet, open_trackers

__all__ = [
    "TRACKERS",
    "Cell",
    "MetricsEndpoint",
    "MissingTrackerPackage",
    "Point",
    "RunFigures",
    "Table",
    "TrackedRun",
    "Tracker",
    "TrackerFactory",
    "TrackerSet",
    "TrackerSpec",
    "TrackingConfig",
    "TrackingError",
    "TrackingFeed",
    "build_tracker",
    "open_trackers",
    "tracker_problem",
]
