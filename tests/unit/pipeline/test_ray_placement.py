"""Ray placement without a Ray cluster: fake actors behind `RemoteChild`, the real `Supervisor`,
the config checks and `stacx run --ray`. The real 2-node cluster:
tests/integration/infra/test_ray_cluster.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import ray.exceptions as ray_exceptions
import yaml

from stacx.infra.pipeline.errors import PipelineConfigError, ServiceError
from stacx.infra.pipeline.raycluster import (
    LOST,
    NODE_IP,
    NodeLostError,
    RayPlacementConfig,
    RayService,
    RemoteChild,
)
from stacx.infra.pipeline.services import RestartPolicy, ServiceSpec, Supervisor

REPO = Path(__file__).resolve().parents[3]


class _Call:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return lambda: self.fn(*args)


class FakeActor:
    """A `ServiceHost` on node `ip`: its service runs until `exit` or `lose`."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.status: int | None = None
        self.dead = False
        self.signals: list[int] = []
        self.poll = _Call(lambda: self._answer(self.status))
        self.signal_group = _Call(self._signal)
        self.stop = _Call(self._stop)

    def _answer(self, value: Any) -> Any:
        if self.dead:
            raise ray_exceptions.ActorDiedError()
        return value

    def _signal(self, sig: int) -> None:
        self._answer(None)
        self.signals.append(sig)

    def _stop(self, timeout_s: float) -> int:
        self._answer(None)
        self.status = -int(signal.SIGTERM) if self.status is None else self.status
        return self.status


def fake_get(call: Any, timeout: float) -> Any:
    return call()


class FakePlacement:
    """`RayPlacement` for RayService: actors on the nodes listed, in turn; kills recorded."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.actors: list[FakeActor] = []
        self.killed: list[FakeActor] = []

    def new_actor(self, name: str, bundle: Any) -> FakeActor:
        actor = FakeActor(self.nodes[min(len(self.actors), len(self.nodes) - 1)])
        self.actors.append(actor)
        return actor

    def start_on(self, actor: FakeActor, spec: ServiceSpec, log_path: Path) -> RemoteChild:
        # the remote pid is a live pid of *this* machine: signalling it here would hit this test
        return RemoteChild(actor, pid=os.getpid(), node_ip=actor.ip, get=fake_get)

    def kill(self, actor: FakeActor) -> None:
        self.killed.append(actor)


@pytest.fixture
def no_local_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError(f"a remote service's pid was signalled on the driver: {args}")

    monkeypatch.setattr(os, "killpg", refuse)
    monkeypatch.setattr(os, "kill", refuse)


def _service(tmp_path: Path, placement: FakePlacement) -> RayService:
    spec = ServiceSpec(name="gateway", args=["gateway", "--host", NODE_IP],
                       ready_url=f"http://{NODE_IP}:8710/healthz")
    return RayService(spec, tmp_path, placement=placement)  # type: ignore[arg-type]


def test_ready_url_is_the_node_the_actor_landed_on(tmp_path: Path) -> None:
    service = _service(tmp_path, FakePlacement(["10.0.0.7"])).start()
    assert service.spec.ready_url == "http://10.0.0.7:8710/healthz"
    assert service.template.ready_url == f"http://{NODE_IP}:8710/healthz"
    assert service.alive()


def test_a_lost_node_is_a_crash_restarted_on_another_node_within_the_budget(
    tmp_path: Path, no_local_signals: None
) -> None:
    now = [0.0]
    placement = FakePlacement(["10.0.0.3", "10.0.0.2", "10.0.0.2"])
    supervisor = Supervisor(RestartPolicy(max_restarts=1, backoff_s=1.0), clock=lambda: now[0])
    service = _service(tmp_path, placement).start()
    supervisor.add(service)
    first = placement.actors[0]
    first.dead = True  # the worker node is gone
    assert supervisor.poll() == []  # crash noticed: backoff
    assert service.proc is not None and service.proc.returncode == LOST
    assert first in placement.killed  # the dead actor is released, never a local pid signalled
    now[0] = 1.0
    assert supervisor.poll() == ["gateway"]
    assert service.node_ip == "10.0.0.2" and service.spec.ready_url == "http://10.0.0.2:8710/healthz"
    placement.actors[1].dead = True
    with pytest.raises(ServiceError, match="restart budget"):
        supervisor.poll()


def test_stop_goes_through_the_actor(tmp_path: Path, no_local_signals: None) -> None:
    placement = FakePlacement(["10.0.0.2"])
    service = _service(tmp_path, placement).start()
    actor = placement.actors[0]
    service.stop(timeout_s=1.0)
    assert actor.status == -int(signal.SIGTERM)
    assert placement.killed == [actor] and service.actor is None
    assert not service.alive()


def test_a_stop_of_a_service_on_a_dead_node_does_not_hang(tmp_path: Path, no_local_signals: None) -> None:
    placement = FakePlacement(["10.0.0.3"])
    service = _service(tmp_path, placement).start()
    placement.actors[0].dead = True
    service.stop(timeout_s=1.0)
    assert service.proc is not None and service.proc.returncode == LOST


def test_a_silent_actor_is_not_yet_a_crash(tmp_path: Path) -> None:
    """A partitioned node answers nothing until Ray marks it dead: poll says running, not gone."""

    def slow(call: Any, timeout: float) -> Any:
        raise ray_exceptions.GetTimeoutError()

    child = RemoteChild(FakeActor("10.0.0.3"), pid=1, node_ip="10.0.0.3", get=slow)
    assert child.poll() is None


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ({"kind": "ray", "address": "head"}, "placement.address: address 'head': write HOST:PORT"),
        ({"kind": "ray", "address": "h:1", "groups": {"trainer": {"bundle": {}}}},
         "placement.groups.trainer.bundle: a bundle needs a positive amount"),
        ({"kind": "ray", "address": "h:1", "groups": {"trainer": {"strategy": "SIDEWAYS"}}},
         "placement.groups.trainer.strategy"),
        ({"kind": "ray", "address": "h:1", "services": {"gateway": {"num_gpus": -1}}},
         "placement.services.gateway.num_gpus"),
        ({"kind": "slurm", "address": "h:1"}, "placement.kind"),
    ],
)
def test_bad_placement_sections_name_the_field(section: dict[str, Any], needle: str) -> None:
    from stacx.infra.pipeline.config import parse_spec

    tree = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    tree["placement"] = section
    with pytest.raises(PipelineConfigError) as info:
        parse_spec(tree, source="q.yaml", base_dir=REPO / "examples")
    assert f"q.yaml: {needle}" in str(info.value)


def test_placement_section_is_read() -> None:
    from stacx.infra.pipeline.config import parse_spec

    tree = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    tree["placement"] = {"kind": "ray", "address": "10.0.0.1:6379",
                         "services": {"gateway": {"resources": {"docker": 1}}},
                         "groups": {"policy": {"ranks": 2, "strategy": "SPREAD"}}}
    spec = parse_spec(tree, source="q.yaml", base_dir=REPO / "examples")
    assert isinstance(spec.placement, RayPlacementConfig)
    assert spec.placement.services["gateway"].resources == {"docker": 1}
    assert spec.placement.groups["policy"].ranks == 2


def test_run_with_a_bad_ray_address_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from stacx.infra.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["run", str(REPO / "examples/quickstart.yaml"), "--ray", "nohost", "--explain"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2
    assert err == ["stacx run: --ray nohost: address 'nohost': write HOST:PORT of the Ray head "
                   "(e.g. 10.0.0.1:6379) or auto"]


def test_run_with_ray_sets_the_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    import stacx.infra.pipeline as pipeline
    from stacx.infra.cli import main

    seen: dict[str, Any] = {}

    def fake_run(spec: Any) -> dict[str, Any]:
        seen["placement"] = spec.placement
        raise pipeline.PipelineError("stopped by the test")

    monkeypatch.setattr(pipeline, "run_pipeline", fake_run)
    with pytest.raises(SystemExit) as exited:
        main(["run", str(REPO / "examples/quickstart.yaml"), "--ray", "10.0.0.1:6379", "--no-live"])
    assert exited.value.code == 1
    assert seen["placement"].address == "10.0.0.1:6379"


def test_a_gateway_restarted_on_another_node_repoints_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollout service's config names the gateway's URL: after the gateway moves, rollout is
    restarted with a config that names the new node."""
    from stacx.infra.pipeline.config import parse_spec
    from stacx.infra.pipeline.rayrun import RayPipeline

    monkeypatch.chdir(tmp_path)
    tree = yaml.safe_load((REPO / "examples/quickstart.yaml").read_text())
    tree["pipeline"]["runs_dir"] = str(tmp_path / "runs")
    tree["placement"] = {"kind": "ray", "address": "10.0.0.1:6379"}
    spec = parse_spec(tree, source="q.yaml", base_dir=REPO / "examples")
    pipeline = RayPipeline(spec)
    placement = FakePlacement(["10.0.0.3", "10.0.0.2"])
    gateway = _service(tmp_path, placement).start()
    pipeline.services["gateway"] = gateway
    pipeline._bind(gateway)
    assert pipeline.gateway_url == "http://10.0.0.3:8710"
    rollout_nodes = FakePlacement(["10.0.0.2"])
    rollout = RayService(ServiceSpec(name="rollout", args=["rollout"]), tmp_path,
                         placement=rollout_nodes)  # type: ignore[arg-type]
    pipeline.services["rollout"] = rollout.start()
    pipeline._sft_model = tmp_path / "model"
    monkeypatch.setattr("stacx.infra.pipeline.rayrun.Pipeline._learner_specs",
                        lambda self, model: seen.append(self.gateway_url))
    seen: list[str] = []
    gateway.start()  # the supervisor's restart: a new actor, on the next node
    pipeline.restarted(["gateway"])
    assert pipeline.gateway_url == "http://10.0.0.2:8710"
    assert seen == ["http://10.0.0.2:8710"]  # configs rewritten with the new URL
    assert len(rollout_nodes.actors) == 2  # rollout restarted


class _DyingFirstNode(FakePlacement):
    """The first actor lands on a node that dies before the service starts (Ray had not yet
    marked it dead): its start fails with NodeLostError; the next actor lands on a live node."""

    config = RayPlacementConfig(address="10.0.0.2:6379", start_timeout_s=30)

    def start_on(self, actor: FakeActor, spec: ServiceSpec, log_path: Path) -> RemoteChild:
        if len(self.actors) == 1:
            raise NodeLostError(f"placement.services.{spec.name}: its node died before it started")
        return super().start_on(actor, spec, log_path)


def test_a_service_placed_on_a_dying_node_is_placed_again(tmp_path: Path) -> None:
    placement = _DyingFirstNode(["10.0.0.3", "10.0.0.2"])
    service = _service(tmp_path, placement)  # type: ignore[arg-type]
    service.start()
    assert [a.ip for a in placement.actors] == ["10.0.0.3", "10.0.0.2"]
    assert service.proc is not None and service.proc.node_ip == "10.0.0.2"
