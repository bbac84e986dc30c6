"""The orchestrator starts the GRPO services at once and waits for them together; it stops them in waves."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacx.infra.pipeline import orchestrator
from stacx.infra.pipeline.config import load_spec
from stacx.infra.pipeline.orchestrator import Pipeline
from stacx.infra.pipeline.services import ServiceSpec
from stacx.rollout.models import make_tiny_model

REPO = Path(__file__).resolve().parents[3]


class _Recorded:
    """A service that only notes when it was started and when waited for."""

    events: list[tuple[str, str]] = []

    def __init__(self, spec: ServiceSpec, log_dir: Path, **_: object) -> None:
        self.spec = spec

    def start(self) -> _Recorded:
        self.events.append(("start", self.spec.name))
        return self

    def wait_ready(self, timeout_s: float) -> None:
        self.events.append(("ready", self.spec.name))


def test_the_learners_start_with_the_server_and_all_are_waited_for_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wait costs at least the settle time of a service without a health URL (2 s): waited
    for one by one, the rollout service started 4 s after the inference server was up. The
    assembler and the trainer need nothing but the run's topics, and the rollout service waits
    for the server's health itself, so all three start with the server: their start-up overlaps
    its own instead of following it. The two that are fresh processes start first, while the
    preloader still imports; of the forked two the server goes first: the first rollouts wait
    for it, and the trainer would otherwise take the preloader's first turn."""
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    spec.pipeline.runs_dir = str(tmp_path / "runs")
    spec.pipeline.services.preload = False
    pipeline = Pipeline(spec)
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(_Recorded, "events", events)
    monkeypatch.setattr(orchestrator, "ServiceProcess", _Recorded)
    model = make_tiny_model(tmp_path / "model")
    pipeline._start_serving(model)
    started = [("start", n) for n in ("gateway", "assembler", "rollout", "inference", "trainer")]
    assert events == [*started, ("ready", "gateway"), ("ready", "inference")]
    rollout = yaml.safe_load((pipeline.layout.config_dir / "rollout.yaml").read_text())
    assert rollout["inference"]["wait_ready_s"] == spec.pipeline.services.startup_timeout_s
    events.clear()
    pipeline._wait_training_services()
    names = ["assembler", "trainer", "rollout"]
    assert events == [("ready", n) for n in names]
    assert pipeline.services["trainer"].spec.finishes
    assert set(pipeline.supervisor.services) == {"gateway", "inference", *names}


class _Stoppable:
    """A started service whose stop() notes when it began and ended; the second wave's two stops
    meet at a barrier, which only two stops running at once can pass."""

    def __init__(self, name: str, events: list[str], barrier: threading.Barrier) -> None:
        self.name, self.events, self.barrier = name, events, barrier

    def stop(self) -> None:
        self.events.append(f"stop {self.name}")
        if self.name in ("trainer", "assembler"):
            self.barrier.wait()
        self.events.append(f"stopped {self.name}")


def test_shutdown_stops_in_waves_and_each_wave_at_once(tmp_path: Path) -> None:
    """One by one, a run's five services took 5 s to stop; the rollout service still stops
    first (no new requests) and the servers and the gateway last (in-flight episodes finish)."""
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    spec.pipeline.runs_dir = str(tmp_path / "runs")
    pipeline = Pipeline(spec)
    events: list[str] = []
    barrier = threading.Barrier(2, timeout=60)
    for name in ("gateway", "inference", "assembler", "trainer", "rollout"):
        pipeline.services[name] = _Stoppable(name, events, barrier)  # type: ignore[assignment]
    pipeline._reap_sandboxes = lambda: None  # type: ignore[method-assign]  # no engine here
    pipeline._shutdown()
    assert events[:2] == ["stop rollout", "stopped rollout"]
    assert set(events[2:4]) == {"stop trainer", "stop assembler"}  # both began before either ended
    assert set(events[4:6]) == {"stopped trainer", "stopped assembler"}
    last = events[6:]
    assert set(last) == {"stop inference", "stopped inference", "stop gateway", "stopped gateway"}
    assert last.index("stopped gateway") > last.index("stop gateway")
    assert not barrier.broken
