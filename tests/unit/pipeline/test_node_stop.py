"""A node stops in seconds: every service signalled at once (its broker after them), none
restarted once stopping, and a short grace when the brokers are gone (nothing left to flush)."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from stacx.infra.pipeline import node as node_module
from stacx.infra.pipeline import parse_spec
from stacx.infra.pipeline.layout import RunLayout
from stacx.infra.pipeline.node import GONE_GRACE_S, STOP_GRACE_S, NodeRunner

REPO = Path(__file__).resolve().parents[3]


class _Service:
    def __init__(self, name: str, calls: list[tuple[str, str, float | None]]) -> None:
        self.name, self.calls = name, calls
        self.spec = SimpleNamespace(name=name)

    def terminate(self) -> None:
        self.calls.append(("terminate", self.name, None))

    def stop(self, timeout_s: float = 20.0) -> None:
        self.calls.append(("stop", self.name, timeout_s))

    def alive(self) -> bool:
        return False  # crashed: a supervisor still watching it would restart it

    def finished(self) -> bool:
        return False


def _runner(host: str) -> NodeRunner:
    tree: dict[str, Any] = yaml.safe_load((REPO / "examples" / "cluster" / "cluster.yaml").read_text())
    tree["pipeline"]["plugin_paths"] = [str(REPO / "examples")]
    spec = parse_spec(copy.deepcopy(tree), source="cluster.yaml", base_dir=REPO / "examples" / "cluster")
    return NodeRunner(spec, RunLayout.create(spec), host)


@pytest.mark.parametrize(("brokers_answer", "grace_s"), [(True, STOP_GRACE_S), (False, GONE_GRACE_S)])
def test_a_stopping_node_signals_every_service_at_once_and_restarts_none(
    monkeypatch: pytest.MonkeyPatch, brokers_answer: bool, grace_s: float
) -> None:
    runner = _runner("roll-1")
    calls: list[tuple[str, str, float | None]] = []
    for name in ("broker", "gateway", "inference", "rollout"):
        service = _Service(name, calls)
        runner.services[name] = service  # type: ignore[assignment]
        runner.supervisor.add(service)  # type: ignore[arg-type]
    monkeypatch.setattr(NodeRunner, "_brokers_answer", lambda self: brokers_answer)
    runner._stop_all()
    assert runner.supervisor.poll() == [] and not runner.supervisor.services  # nothing restarts
    kinds = [(kind, name) for kind, name, _ in calls]
    assert kinds[:3] == [("terminate", "rollout"), ("terminate", "inference"), ("terminate", "gateway")]
    assert kinds[3:6] == [("stop", "rollout"), ("stop", "inference"), ("stop", "gateway")]
    assert kinds[6:] == [("terminate", "broker"), ("stop", "broker")]  # the broker after its users
    waits = [timeout for kind, name, timeout in calls if kind == "stop" and name != "broker"]
    assert all(w is not None and w <= grace_s for w in waits) and waits[0] > grace_s - 1  # one grace, shared


def test_the_grace_when_brokers_are_gone_is_seconds() -> None:
    assert GONE_GRACE_S <= 5 and node_module.STOP_GRACE_S <= 30
