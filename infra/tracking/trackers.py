"""Several trackers as one: built together, fed together, and one failing is set aside."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stacx.infra.tracking.config import TrackingConfig
from stacx.infra.tracking.errors import TrackingError
from stacx.infra.tracking.protocols import Outcome, Table, TrackedRun, Tracker
from stacx.infra.tracking.registry import build_tracker

__all__ = ["TrackerSet", "open_trackers"]

log = logging.getLogger(__name__)


class TrackerSet:
    """Named trackers fed as one. A tracker that raises is named in one log line and fed no more:
    a tracker never stops a run."""

    def __init__(self, trackers: list[tuple[str, Tracker]], locations: dict[str, Path] | None = None) -> None:
        self._trackers = list(trackers)
        self.locations = dict(locations or {})
        """Each tracker's folder."""

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._trackers]

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._each("log_config", config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if metrics:
            self._each("log_metrics", step, metrics)

    def log_table(self, name: str, step: int, table: Table) -> None:
        self._each("log_table", name, step, table)

    def log_summary(self, step: int, metrics: Mapping[str, float]) -> None:
        """The run's headline figures, to the trackers that keep a summary (`log_summary`)."""
        if metrics:
            self._each("log_summary", step, metrics, optional=True)

    def finish(self, outcome: Outcome = "finished") -> None:
        for name, tracker in list(self._trackers):
            takes_outcome = _takes_argument(tracker.finish)
            self._call(name, tracker, "finish", *((outcome,) if takes_outcome else ()))
        self._trackers = []

    def _each(self, method: str, *args: Any, optional: bool = False) -> None:
        for name, tracker in list(self._trackers):
            if optional and not hasattr(tracker, method):
                continue
            self._call(name, tracker, method, *args)

    def _call(self, name: str, tracker: Tracker, method: str, *args: Any) -> None:
        try:
            getattr(tracker, method)(*args)
        except Exception as exc:  # a tracker's library may raise anything: the run goes on
            kind = type(exc).__name__
            log.error("tracker %s: %s raised %s: %s; it gets nothing more", name, method, kind, exc)
            if (name, tracker) in self._trackers:
                self._trackers.remove((name, tracker))


def _takes_argument(method: Any) -> bool:
    """Whether `method` accepts one positional argument (a plug-in's `finish()` may not)."""
    try:
        inspect.signature(method).bind("finished")
    except (TypeError, ValueError):
        return False
    return True


def open_trackers(config: TrackingConfig, *, name: str, run_id: str, root: Path) -> TrackerSet:
    """Every tracker of `config`, each writing under `root/<tracker>/`; `TrackingError` (one
    line, with the tracker's place in the list) when one cannot be built, the others closed."""
    built: list[tuple[str, Tracker]] = []
    locations: dict[str, Path] = {}
    for index, spec in enumerate(config.trackers):
        run = TrackedRun(name=name, run_id=run_id, dir=root / spec.folder)
        try:
            built.append((spec.name, build_tracker(spec.name, spec.options, run)))
        except TrackingError as exc:
            TrackerSet(built).finish()
            raise type(exc)(f"tracking.trackers[{index}]: {exc}") from exc
        locations[spec.name] = run.dir
    return TrackerSet(built, locations)
