"""Which runs there are: the run folders the pipeline writes (`runs/<name>/`) and the run topics
on the broker (`stacx.trajectories.<run id>`), merged by run id.

A run folder names its topics in `report.json` (a finished run) or in the service configs under
`config/` (a run still going, or one stopped before its report). Pure file reading: unit-tested
without services.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stacx.schemas import topics

__all__ = ["RunEntry", "RunStatus", "merge_runs", "read_run_dir", "runs_in_dir", "runs_on_broker"]

LIVE_WINDOW_S = 120.0
"""A run without a report whose logs changed this recently is still going."""


class RunStatus:
    """What the run list says of a run."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    """No report and no log line for a while: the pipeline was stopped or killed."""
    TOPICS_ONLY = "topics only"
    """Topics on the broker, no run folder in the runs directory."""


@dataclass(kw_only=True, slots=True)
class RunEntry:
    """One run: its id, topics, folder and status."""

    run_id: str
    name: str
    status: str
    trajectories_topic: str
    """"" while the run warms up: its services (and the configs naming its topics) start after."""
    weights_topic: str | None = None
    batches_topic: str | None = None
    model_name: str | None = None
    """Set where the run shares the standard topics with other runs: only its model's events."""
    root: Path | None = None
    report: dict[str, Any] | None = None
    updated: float = 0.0
    """Newest modification time of the folder's report and logs (epoch s)."""
    started: float = 0.0
    """When the run folder was made (epoch s)."""

    @property
    def live(self) -> bool:
        return self.status == RunStatus.RUNNING


def _run_id_of(topic: str, kind: str) -> str | None:
    prefix = f"{kind}."
    return topic[len(prefix) :] if topic.startswith(prefix) and len(topic) > len(prefix) else None


def _yaml(path: Path) -> dict[str, Any]:
    try:
        tree = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return tree if isinstance(tree, dict) else {}


def _report(root: Path) -> dict[str, Any] | None:
    try:
        report = json.loads((root / "report.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return report if isinstance(report, dict) else None


def _from_configs(root: Path) -> dict[str, Any]:
    """Topics and model of the run whose service configs are in `root/config/`."""
    rollout = _yaml(root / "config" / "rollout.yaml")
    trainer = _yaml(root / "config" / "trainer.yaml")
    assembler = _yaml(root / "config" / "assembler.yaml")
    kafka = rollout.get("kafka") or {}
    manager = rollout.get("manager") or {}
    assembly = assembler.get("assembler") or {}
    return {
        "trajectories": kafka.get("trajectories_topic") or assembly.get("trajectories_topic"),
        "weights": kafka.get("weights_topic") or (trainer.get("export") or {}).get("topic"),
        "batches": assembly.get("batches_topic") or (trainer.get("source") or {}).get("topic"),
        "model_name": manager.get("model_name"),
    }


def _updated(root: Path) -> float:
    paths = [root / "report.json", *(root / "logs").glob("*.log")]
    return max((p.stat().st_mtime for p in paths if p.is_file()), default=0.0)


def read_run_dir(root: Path, *, now: float | None = None) -> RunEntry | None:
    """The run of one run folder (None: not a run folder, or no topics named in it)."""
    now = time.time() if now is None else now
    report = _report(root)
    configured = _from_configs(root)
    updated = _updated(root)
    report_topics = (report or {}).get("topics") or {}
    trajectories = configured["trajectories"] or report_topics.get("trajectories")
    if not trajectories:
        return _warming_up(root, now, updated)
    run_id = _run_id_of(trajectories, topics.TRAJECTORIES)
    finished = report is not None and (run_id is None or report.get("run_id") == run_id)
    if finished:
        assert report is not None
        status = RunStatus.FINISHED if report.get("status") == "ok" else RunStatus.FAILED
        run_id = str(report.get("run_id") or run_id or root.name)
    else:
        status = RunStatus.RUNNING if now - updated <= LIVE_WINDOW_S else RunStatus.STOPPED
        report = None
    shared = _run_id_of(trajectories, topics.TRAJECTORIES) is None
    return RunEntry(
        run_id=run_id or root.name,
        name=root.name,
        status=status,
        trajectories_topic=trajectories,
        weights_topic=configured["weights"] or report_topics.get("weights"),
        batches_topic=configured["batches"] or report_topics.get("batches"),
        model_name=(configured["model_name"] or (report or {}).get("model_name")) if shared else None,
        root=root,
        report=report,
        updated=updated,
    )


def _warming_up(root: Path, now: float, updated: float) -> RunEntry | None:
    """A run folder with logs only: the warm start, before the services and their configs."""
    if not (root / "logs" / "pipeline.log").is_file():
        return None
    made = root / "config" if (root / "config").is_dir() else root / "logs"
    return RunEntry(
        run_id=root.name,
        name=root.name,
        status=RunStatus.RUNNING if now - updated <= LIVE_WINDOW_S else RunStatus.STOPPED,
        trajectories_topic="",
        root=root,
        updated=updated,
        started=made.stat().st_mtime,
    )


def _stamp_of(run_id: str, name: str) -> float | None:
    """Epoch seconds of the `<name>-YYYYmmdd-HHMMSS` run id a pipeline gives a run (None: not one)."""
    m = re.fullmatch(re.escape(name) + r"-(\d{8}-\d{6})", run_id)
    if m is None:
        return None
    return float(calendar.timegm(time.strptime(m.group(1), "%Y%m%d-%H%M%S")))


def _adopt(folder: RunEntry, on_broker: list[RunEntry]) -> RunEntry | None:
    """The broker run a warming-up folder started: its name, stamped when the folder was made."""
    stamped = [(stamp, r) for r in on_broker if (stamp := _stamp_of(r.run_id, folder.name)) is not None]
    near = [(stamp, r) for stamp, r in stamped if abs(stamp - folder.started) <= LIVE_WINDOW_S]
    return max(near, key=lambda pair: pair[0])[1] if near else None


def runs_in_dir(runs_dir: Path, *, now: float | None = None) -> list[RunEntry]:
    """Every run folder directly under `runs_dir` (none when it does not exist)."""
    if not runs_dir.is_dir():
        return []
    found = (read_run_dir(p, now=now) for p in sorted(runs_dir.iterdir()) if p.is_dir())
    return [run for run in found if run is not None]


def runs_on_broker(topic_names: Iterable[str]) -> list[RunEntry]:
    """A run for every `stacx.trajectories.<run id>` topic, with its sibling topics where present."""
    names = set(topic_names)
    out = []
    for name in sorted(names):
        run_id = _run_id_of(name, topics.TRAJECTORIES)
        if run_id is None:
            continue
        weights, batches = f"{topics.WEIGHTS}.{run_id}", f"{topics.BATCHES}.{run_id}"
        out.append(
            RunEntry(
                run_id=run_id,
                name=run_id,
                status=RunStatus.TOPICS_ONLY,
                trajectories_topic=name,
                weights_topic=weights if weights in names else None,
                batches_topic=batches if batches in names else None,
            )
        )
    return out


def merge_runs(in_dir: list[RunEntry], on_broker: list[RunEntry]) -> list[RunEntry]:
    """The folder's runs and the broker-only ones, newest folder first, then by run id."""
    for folder in in_dir:
        match = _adopt(folder, on_broker) if not folder.trajectories_topic else None
        if match is not None:
            folder.run_id, folder.trajectories_topic = match.run_id, match.trajectories_topic
            folder.weights_topic, folder.batches_topic = match.weights_topic, match.batches_topic
    known = {run.run_id for run in in_dir}
    folders = sorted(in_dir, key=lambda r: -r.updated)
    others = sorted((r for r in on_broker if r.run_id not in known), key=lambda r: r.run_id, reverse=True)
    return folders + others
