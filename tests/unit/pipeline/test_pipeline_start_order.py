"""The orchestrator starts the GRPO services at once and then waits for them together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.pipeline import orchestrator
from infra.pipeline.config import load_spec
from infra.pipeline.orchestrator import Pipeline
from infra.pipeline.services import ServiceSpec
from rollout.models import make_tiny_model

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
    assembler and the trainer need nothing but the run's topics, so they start with the server:
    their start-up overlaps its own instead of following it (the first policy version came 3 s
    sooner). Only the rollout service waits for the server."""
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    spec.pipeline.runs_dir = str(tmp_path / "runs")
    spec.pipeline.services.preload = False
    pipeline = Pipeline(spec)
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(_Recorded, "events", events)
    monkeypatch.setattr(orchestrator, "ServiceProcess", _Recorded)
    model = make_tiny_model(tmp_path / "model")
    pipeline._start_serving(model)
    assert events == [("start", "gateway"), ("start", "assembler"), ("start", "trainer"), ("start", "inference"),
                      ("ready", "gateway"), ("ready", "inference")]
    events.clear()
    pipeline._start_training_services(model)
    names = ["assembler", "trainer", "rollout"]
    assert events == [("start", "rollout")] + [("ready", n) for n in names]
    assert pipeline.services["trainer"].spec.finishes
    assert set(pipeline.supervisor.services) == {"gateway", "inference", *names}
