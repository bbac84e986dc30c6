"""Experiment trackers fed from a run's own topics and the services' metrics endpoints.

A run names its trackers in `pipeline.tracking` (`[tensorboard, wandb, mlflow]`, or
`{name, options}` entries, or a `package.module:factory`, or an entry point in `stacx.trackers`);
each is a `Tracker` built as `factory(run, **options)`. One consumer thread of the orchestrator
(`TrackingFeed`, consumer group `stacx-tracking-<run id>`) turns trajectory, batch and
weight-version events and the servers' Prometheus figures into per-version figures
(`RunFigures`) and logs them to every tracker: no service knows trackers.
"""

from __future__ import annotations

from infra.tracking.config import TrackerSpec, TrackingConfig
from infra.tracking.errors import MissingTrackerPackage, TrackingError
from infra.tracking.feed import TrackingFeed
from infra.tracking.figures import Point, RunFigures
from infra.tracking.protocols import Cell, Table, TrackedRun, Tracker, TrackerFactory
from infra.tracking.registry import TRACKERS, build_tracker, tracker_problem
from infra.tracking.scrape import MetricsEndpoint
from infra.tracking.trackers import TrackerSet, open_trackers

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
