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

    def __init__(self, spec: ServiceSpec, log_dir: Path) -> None:
        self.spec = spec

    def start(self) -> _Recorded:
        self.events.append(("start", self.spec.name))
        return self

    def wait_ready(self, timeout_s: float) -> None:
        self.events.append(("ready", self.spec.name))


def test_assembler_trainer_and_rollout_all_start_before_any_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wait costs at least the settle time of a service without a health URL (2 s): waited
    for one by one, the rollout service started 4 s after the inference server was up."""
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    spec.pipeline.runs_dir = str(tmp_path / "runs")
    pipeline = Pipeline(spec)
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(_Recorded, "events", events)
    monkeypatch.setattr(orchestrator, "ServiceProcess", _Recorded)
    pipeline._start_training_services(make_tiny_model(tmp_path / "model"))
    names = ["assembler", "trainer", "rollout"]
    assert events == [("start", n) for n in names] + [("ready", n) for n in names]
    assert pipeline.services["trainer"].spec.finishes
    assert set(pipeline.supervisor.services) == set(names)
