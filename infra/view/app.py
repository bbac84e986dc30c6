"""The `stacx view` web app: run list, a run's status and curves, the trajectory browser.

Pages are server-rendered (`stacx.infra.view.pages`); the only asset is the local stylesheet. A run's
topics are read on demand and on from where they stopped, so a live run's pages grow as it goes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml
from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from stacx.infra.traces import FRAMEWORK_SPANS, TRACE_ID, TraceQueryError, fetch_trace, follow_training
from stacx.infra.view.curves import per_version, read_trainer_steps
from stacx.infra.view.pages import (
    STYLESHEET,
    TrajectoryFilter,
    run_list_page,
    run_page,
    trajectories_page,
    trajectory_page,
)
from stacx.infra.view.reader import RunTopicsReader
from stacx.infra.view.runs import RunEntry, merge_runs, runs_in_dir, runs_on_broker
from stacx.infra.view.trace_page import trace_page

__all__ = ["ViewConfig", "create_app"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class ViewConfig:
    """What `stacx view` serves."""

    runs_dir: Path = Path("runs")
    """Folder of the pipeline's run folders (`pipeline.runs_dir`)."""
    bootstrap_servers: str = "127.0.0.1:9092"
    """Kafka broker holding the runs' topics."""
    jaeger_url: str = "http://127.0.0.1:16686"
    """Trace backend query API (Jaeger's `/api/traces`): the view's trace pages
    (`/traces/<trace id>`) read the spans there."""
    broker_timeout_s: float = 5.0
    """Deadline of one broker request (topic list, watermarks)."""
    host: str = "127.0.0.1"
    """Address `stacx view` listens on."""
    port: int = 8760
    """Port `stacx view` listens on (1-65535)."""

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not a port (1-65535)")


@dataclass(kw_only=True, slots=True)
class _State:
    config: ViewConfig
    readers: dict[str, RunTopicsReader] = field(default_factory=dict)
    topic_names: list[str] = field(default_factory=list)
    topics_read_at: float = 0.0
    broker_error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def broker_topics(self) -> list[str]:
        with self.lock:
            if time.monotonic() - self.topics_read_at > 5.0:
                self.topics_read_at = time.monotonic()
                try:
                    from confluent_kafka.admin import AdminClient

                    admin = AdminClient({"bootstrap.servers": self.config.bootstrap_servers})
                    self.topic_names = list(admin.list_topics(timeout=self.config.broker_timeout_s).topics)
                    self.broker_error = None
                except Exception as exc:  # the page still lists the run folders
                    self.broker_error = (
                        f"the broker at {self.config.bootstrap_servers} does not answer "
                        f"({type(exc).__name__}: {exc}); showing the run folders only"
                    )
            return self.topic_names

    def runs(self) -> list[RunEntry]:
        return merge_runs(runs_in_dir(self.config.runs_dir), runs_on_broker(self.broker_topics()))

    def run(self, run_id: str) -> RunEntry:
        for run in self.runs():
            if run.run_id == run_id:
                return run
        raise HTTPException(
            status_code=404, detail=f"no run {run_id!r} in {self.config.runs_dir} or on the broker"
        )

    def reader(self, run: RunEntry) -> RunTopicsReader | None:
        """The run's topic reader, refreshed (None: the run names no topics yet)."""
        if not run.trajectories_topic:
            return None
        with self.lock:
            reader = self.readers.get(run.run_id)
            if reader is None:
                reader = RunTopicsReader(
                    bootstrap_servers=self.config.bootstrap_servers,
                    trajectories_topic=run.trajectories_topic,
                    weights_topic=run.weights_topic,
                    model_name=run.model_name,
                    timeout_s=self.config.broker_timeout_s,
                )
                self.readers[run.run_id] = reader
        reader.refresh()
        return reader

    def close(self) -> None:
        with self.lock:
            for reader in self.readers.values():
                reader.close()
            self.readers.clear()


def _stage(run: RunEntry) -> str | None:
    """The live run's stage: the last status line of its pipeline log."""
    if run.root is None or run.report is not None:
        return None
    try:
        lines = (run.root / "logs" / "pipeline.log").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if "stage: " in line:
            return line.split("stage: ", 1)[1].split(" | ", 1)[0]
    return None


def _tokenizer_dir(run: RunEntry) -> str | None:
    if run.root is None:
        return None
    try:
        tree = yaml.safe_load((run.root / "config" / "rollout.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    value = (tree.get("inference") or {}).get("tokenizer") if isinstance(tree, dict) else None
    return str(value) if value and Path(str(value)).is_dir() else None


@lru_cache(maxsize=8)
def _decoder(path: str) -> Callable[[int], str] | None:
    """One token's text with the run's tokenizer (None: it does not load; ids are shown)."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # a missing or foreign tokenizer: the page shows token ids
        log.warning("tokenizer %s does not load (%s); showing token ids", path, exc)
        return None

    def decode(token: int) -> str:
        return str(tokenizer.decode([token]))

    return decode


def _float(value: str | None, name: str) -> float | None:
    if value is None or not value.strip():
        return None
    try:
        return float(value)
    except ValueError:
        raise HTTPException(status_code=400, detail=f"{name}={value!r} is not a number") from None


def _int(value: str | None, name: str) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise HTTPException(status_code=400, detail=f"{name}={value!r} is not a whole number") from None


def create_app(config: ViewConfig) -> FastAPI:
    """The app; `app.state.view.close()` closes its Kafka clients (the command does on exit)."""
    state = _State(config=config)
    app = FastAPI(title="stacx view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.view = state

    @app.get("/static/view.css")
    def stylesheet() -> Response:
        return Response(STYLESHEET, media_type="text/css")

    @app.get("/", response_class=HTMLResponse)
    def runs() -> str:
        found = state.runs()
        return run_list_page(found, runs_dir=str(config.runs_dir), broker_error=state.broker_error)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run(run_id: str) -> str:
        entry = state.run(run_id)
        reader = state.reader(entry)
        summaries = list(reader.summaries) if reader else []
        versions = list(reader.versions) if reader else []
        newest = max([v.version for v in versions] + [s.policy_version for s in summaries], default=None)
        steps = read_trainer_steps(entry.root / "logs") if entry.root else []
        return run_page(
            entry,
            summaries=summaries,
            rows=per_version(summaries, versions),
            steps=steps,
            newest_version=newest,
            stage=_stage(entry),
            reader_error=reader.error if reader else None,
            undecodable=reader.undecodable if reader else 0,
        )

    @app.get("/runs/{run_id}/trajectories", response_class=HTMLResponse)
    def trajectories(
        run_id: str,
        task: str = "",
        min_reward: str | None = None,
        max_reward: str | None = None,
        version: str | None = None,
        status: str = "",
        limit: int = Query(200, ge=1, le=5000),
        start: int = Query(0, ge=0),
    ) -> str:
        entry = state.run(run_id)
        chosen = TrajectoryFilter(
            task=task,
            min_reward=_float(min_reward, "min_reward"),
            max_reward=_float(max_reward, "max_reward"),
            version=_int(version, "version"),
            status=status,
            limit=limit,
            start=start,
        )
        reader = state.reader(entry)
        return trajectories_page(entry, list(reader.summaries) if reader else [], chosen)

    @app.get("/runs/{run_id}/trajectories/{partition}/{offset}", response_class=HTMLResponse)
    def trajectory(run_id: str, partition: int, offset: int) -> str:
        entry = state.run(run_id)
        reader = state.reader(entry)
        fetched = reader.fetch(partition, offset) if reader else None
        if fetched is None:
            raise HTTPException(
                status_code=404, detail=f"no trajectory at partition {partition}, offset {offset}"
            )
        tokenizer = _tokenizer_dir(entry)
        decode = _decoder(tokenizer) if tokenizer else None
        return trajectory_page(entry, fetched, decode=decode)

    @app.get("/traces/{trace_id}", response_class=HTMLResponse)
    def trace(trace_id: str) -> str:
        if not TRACE_ID.match(trace_id):
            raise HTTPException(status_code=404, detail=f"{trace_id!r} is not a trace id (32 hex digits)")
        try:
            found = fetch_trace(config.jaeger_url, trace_id)
            if found is not None:
                found = follow_training(config.jaeger_url, found).without(FRAMEWORK_SPANS)
        except TraceQueryError as exc:
            return trace_page(trace_id, None, query_url=config.jaeger_url, error=str(exc))
        return trace_page(trace_id, found, query_url=config.jaeger_url, error=None)

    return app
