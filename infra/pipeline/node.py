"""One host of a cluster (`stacx node up --cluster FILE --host NAME`): exactly that host's services.

The `cluster:` section of a pipeline file maps hosts to roles (broker, gateway, inference,
rollout, assembler, trainer). `plan_node` is pure: for one host, the services it runs (each a
`stacx <service>` command, a Kafka broker, or the trainer's ranks under torchrun's c10d
rendezvous), their config sections and the duties of the run's set-up. `NodeRunner` starts them
under the pipeline's `Supervisor` (a crashed service is restarted with backoff) until the trainer
finishes on a trainer host, or SIGINT/SIGTERM stops the node.

The host with the assembler also sets the run up (topics with the topic policy's replication,
the tiny model, the task events, the SFT warm start) and then writes `<run>/setup.json`; every
other host waits for that file. Hosts share `pipeline.runs_dir` (models, checkpoints, weight
exports): one NFS mount on real hosts, the same file system for namespaces on one machine.
The single-host pipeline (`stacx run`) is the one-host case of the same description.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stacx.infra import paths
from stacx.infra.pipeline.config import ClusterConfig, HostConfig, PipelineSpec
from stacx.infra.pipeline.errors import PipelineError
from stacx.infra.pipeline.layout import (
    RunLayout,
    assembler_section,
    gateway_section,
    host_logs_dir,
    inference_section,
    placement,
    rollout_section,
    trainer_section,
)
from stacx.infra.pipeline.placement import visible_devices
from stacx.infra.pipeline.resolve import planned_model_dir
from stacx.infra.pipeline.services import ServiceProcess, ServiceSpec, Supervisor

__all__ = [
    "NodePlan",
    "NodeRunner",
    "broker_of",
    "brokers_needed",
    "explain_node",
    "host_devices",
    "plan_node",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "STACX_SANDBOX_TOKEN"
SETUP_MARKER = "setup.json"
START_ORDER = ("broker", "gateway", "inference", "assembler", "trainer", "rollout")
STOP_GRACE_S = 20.0
"""How long a node waits for its services to stop after SIGTERM before SIGKILL."""
GONE_GRACE_S = 3.0
"""The same when no broker answers any more: nothing a service would still flush can arrive."""


@dataclass(kw_only=True, slots=True)
class NodePlan:
    """What one host runs."""

    host: HostConfig
    run_id: str
    bootstrap_servers: str
    sets_up: bool
    """This host creates the run's topics, model and tasks (the assembler's host)."""
    broker: Any = None
    """`stacx.infra.services.kafka.ClusterBroker` of this host, or None."""
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Config file name (under `<run>/config/<host>/`) -> its contents."""
    services: list[ServiceSpec] = field(default_factory=list)
    """In start order; a service's config file is `files[<name>.yaml]`."""
    trainer_ranks: tuple[int, int] | None = None
    """(first, count) of this host's trainer ranks in the whole group."""
    devices: dict[str, dict[str, str]] = field(default_factory=dict)
    """Role -> `CUDA_VISIBLE_DEVICES` of its service on this host (`resources:`, as `stacx run`)."""


def _url(host: HostConfig, port: int) -> str:
    return f"http://{host.address}:{port}"


def _endpoint(cluster: ClusterConfig, host: HostConfig, role: str, port: int) -> str:
    """The URL of `role` this host uses: its own when it runs one, else the first host's."""
    chosen = host if role in host.roles else cluster.with_role(role)[0]
    return _url(chosen, port)


def broker_of(cluster: ClusterConfig, host: HostConfig, run_id: str) -> Any:
    """The `ClusterBroker` of `host` (node ids follow the broker hosts' order in the file)."""
    from stacx.infra.services.kafka import ClusterBroker, cluster_id_for

    brokers = cluster.with_role("broker")
    voters = ",".join(f"{i}@{h.address}:{cluster.controller_port}" for i, h in enumerate(brokers, 1))
    node_id = next(i for i, h in enumerate(brokers, 1) if h.name == host.name)
    return ClusterBroker(
        node_id=node_id,
        address=host.address,
        port=cluster.kafka_port,
        controller_port=cluster.controller_port,
        voters=voters,
        cluster_id=cluster_id_for(run_id),
        data_dir=paths.stacx_home() / "kafka" / "cluster" / run_id / f"node-{node_id}" / "data",
        heap=cluster.broker_heap,
    )


def brokers_needed(spec: PipelineSpec) -> int:
    """Broker hosts that must answer before a node starts its services: what the topics'
    `min.insync.replicas` needs and a majority of the KRaft controllers (the broker hosts), never
    more than there are; one without a `broker` role (an external cluster)."""
    brokers = len(spec.cluster.with_role("broker"))
    if brokers <= 1:
        return 1
    return min(brokers, max(spec.topics.min_insync_replicas or 1, brokers // 2 + 1))


def _section_world_size(spec: PipelineSpec) -> int:
    """`trainer.backend.world_size` as written (1 when absent)."""
    backend = spec.trainer.get("backend") or {}
    return int(backend.get("world_size", 1) or 1) if isinstance(backend, dict) else 1


def _rank_range(spec: PipelineSpec, host: HostConfig) -> tuple[int, int]:
    """(first, count) of `host`'s ranks, counting the trainer hosts in file order (torchrun's
    c10d rendezvous numbers the hosts as they join: the ranks of one host stay together)."""
    cluster, lone = spec.cluster, _section_world_size(spec)
    first = 0
    for other in cluster.with_role("trainer"):
        if other.name == host.name:
            return first, cluster.ranks_of(host, lone)
        first += cluster.ranks_of(other, lone)
    raise ValueError(f"host {host.name} has no trainer role")


def plan_node(spec: PipelineSpec, layout: RunLayout, host_name: str) -> NodePlan:
    """The services of `host_name` and their config sections; ValueError for an unknown host."""
    cluster = spec.cluster
    host = cluster.host(host_name)
    model_dir = planned_model_dir(spec, layout)
    gateway_port = int(gateway_section(spec, layout)["port"])
    inference_port = int(inference_section(spec, layout, model_dir=model_dir)["server"]["port"])
    node = NodePlan(
        host=host,
        run_id=layout.run_id,
        bootstrap_servers=spec.bootstrap_servers,
        sets_up="assembler" in host.roles,
    )
    if "broker" in host.roles:
        node.broker = broker_of(cluster, host, layout.run_id)
    for role in START_ORDER:
        if role not in host.roles or role == "broker":
            continue
        section = _section(spec, layout, cluster, host, role, model_dir, gateway_port, inference_port)
        node.files[f"{role}.yaml"] = section
    if "trainer" in host.roles:
        node.trainer_ranks = _rank_range(spec, host)
    node.devices = host_devices(spec, host)
    return node


def host_devices(spec: PipelineSpec, host: HostConfig) -> dict[str, dict[str, str]]:
    """`CUDA_VISIBLE_DEVICES` per GPU role of `host` from `resources:` (GPU indices are each
    host's own): the trainer's ranks get `resources.trainer`; the k-th inference host (file
    order) the GPUs of server k (of server 0 past the last), so a host with both roles never
    puts its server and its ranks on the same GPUs unless `resources.colocate` says so."""
    placed, problems = placement(spec)
    if problems or not placed.placed:
        return {}
    devices = {}
    if "trainer" in host.roles:
        devices["trainer"] = visible_devices(placed.trainer)
    if "inference" in host.roles:
        order = [h.name for h in spec.cluster.with_role("inference")].index(host.name)
        devices["inference"] = visible_devices(placed.servers[order if order < len(placed.servers) else 0])
    return {role: env for role, env in devices.items() if env}


def _section(
    spec: PipelineSpec,
    layout: RunLayout,
    cluster: ClusterConfig,
    host: HostConfig,
    role: str,
    model_dir: Path,
    gateway_port: int,
    inference_port: int,
) -> dict[str, Any]:
    if role == "gateway":
        section = gateway_section(spec, layout)
        return {"gateway": {**section, "host": host.address}}
    if role == "inference":
        section = inference_section(spec, layout, model_dir=model_dir)
        return {"inference": {**section, "server": {**section["server"], "host": host.address}}}
    if role == "rollout":  # its own gateway first (else the first host's), the others behind it
        gateway_url = _endpoint(cluster, host, "gateway", gateway_port)
        return rollout_section(
            spec,
            layout,
            model_dir=model_dir,
            inference_url=_endpoint(cluster, host, "inference", inference_port),
            gateway_url=gateway_url,
            fallback_gateways=[
                url
                for url in (_url(other, gateway_port) for other in cluster.with_role("gateway"))
                if url != gateway_url
            ],
            worker=host.name,
        )
    if role == "assembler":
        return assembler_section(spec, layout)
    section = trainer_section(spec, layout, model_dir=model_dir)
    world = cluster.trainer_world_size(_section_world_size(spec))
    if world != _section_world_size(spec):
        backend = dict(section.get("backend") or {})
        kind = "fsdp2" if world > 1 else backend.get("kind", "single")
        section["backend"] = {**backend, "kind": kind, "world_size": world}
    return section


def service_specs(node: NodePlan, cluster: ClusterConfig, config_dir: Path) -> list[ServiceSpec]:
    """The `ServiceSpec` of each role of the host, reading its config file under `config_dir`."""
    specs = []
    for role in START_ORDER:
        name = f"{role}.yaml"
        if name not in node.files:
            continue
        path = str(config_dir / name)
        if role == "gateway":
            port = node.files[name]["gateway"]["port"]
            url = f"http://{node.host.address}:{port}/healthz"
            specs.append(ServiceSpec(name="gateway", args=["gateway", "--config", path], ready_url=url))
        elif role == "inference":
            server = node.files[name]["inference"]["server"]
            url = f"http://{node.host.address}:{server['port']}/health"
            specs.append(ServiceSpec(name="inference", args=["serve", "--config", path], ready_url=url))
        elif role == "assembler":
            specs.append(ServiceSpec(name="assembler", args=["assemble", "--config", path]))
        elif role == "rollout":
            specs.append(ServiceSpec(name="rollout", args=["rollout", path, "--progress", "false"]))
        elif role == "trainer":
            specs.append(_trainer_spec(node, cluster, path))
        specs[-1].env.update(node.devices.get(role, {}))
    return specs


def _trainer_spec(node: NodePlan, cluster: ClusterConfig, path: str) -> ServiceSpec:
    """`stacx train` alone (one host), or this host's ranks under torchrun: c10d rendezvous on the
    first trainer host, one rendezvous id per run."""
    trainers = cluster.with_role("trainer")
    if len(trainers) == 1:  # `stacx train` spawns the host's ranks itself
        return ServiceSpec(name="trainer", args=["train", path], finishes=True)
    assert node.trainer_ranks is not None
    first = trainers[0]
    env = {}
    if node.host.interface:
        env = {"GLOO_SOCKET_IFNAME": node.host.interface, "NCCL_SOCKET_IFNAME": node.host.interface}
    return ServiceSpec(
        name="trainer",
        program=[sys.executable, "-m", "torch.distributed.run"],
        args=[
            f"--nnodes={len(trainers)}",
            f"--nproc-per-node={node.trainer_ranks[1]}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={first.address}:{cluster.rendezvous_port}",
            f"--rdzv-id={node.run_id}",
            # the first trainer host keeps the rendezvous store (not guessed from host names)
            f"--rdzv-conf=is_host={int(node.host.name == first.name)}",
            f"--local-addr={node.host.address}",
            "--max-restarts=0",  # the node's supervisor restarts the whole launch
            "-m",
            "stacx.infra.cli",
            "train",
            path,
        ],
        env=env,
        finishes=True,
    )


def explain_node(spec: PipelineSpec, layout: RunLayout, host_name: str) -> str:
    """What `stacx node up` would start on `host_name`, as YAML (`--explain`): nothing starts."""
    node = plan_node(spec, layout, host_name)
    config_dir = layout.config_dir / node.host.name
    doc: dict[str, Any] = {
        "host": {"name": node.host.name, "address": node.host.address, "roles": list(node.host.roles)},
        "run_id": node.run_id,
        "bootstrap_servers": node.bootstrap_servers,
        "topics": {
            "replication_factor": spec.topics.replication_factor,
            "min_insync_replicas": spec.topics.min_insync_replicas,
        },
        "sets_up_run": node.sets_up,
    }
    if node.broker is not None:
        from stacx.infra.services.kafka import cluster_properties

        doc["broker"] = {"node_id": node.broker.node_id, "properties": cluster_properties(node.broker)}
    if node.trainer_ranks is not None:
        first, count = node.trainer_ranks
        doc["trainer_ranks"] = {
            "first": first,
            "count": count,
            "world_size": spec.cluster.trainer_world_size(_section_world_size(spec)),
        }
    doc["services"] = [
        {"name": s.name, "command": [*(s.program or ["stacx"]), *s.args], **({"env": s.env} if s.env else {})}
        for s in service_specs(node, spec.cluster, config_dir)
    ]
    doc["config_files"] = {str(config_dir / name): body for name, body in node.files.items()}
    return yaml.safe_dump(doc, sort_keys=False, width=110)


class NodeRunner:
    """Starts one host's services under supervision; `run()` returns when the host's trainer
    finished (trainer hosts) and otherwise runs until interrupted. Always stops what it started."""

    def __init__(self, spec: PipelineSpec, layout: RunLayout, host_name: str) -> None:
        self.spec = spec
        self.layout = layout
        self.node = plan_node(spec, layout, host_name)
        self.config_dir = layout.config_dir / self.node.host.name
        self.logs_dir = host_logs_dir(layout.logs_dir, self.node.host.name)
        self.supervisor = Supervisor(spec.pipeline.services.restarts)
        self.services: dict[str, ServiceProcess] = {}
        self._token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)

    def run(self) -> int:
        try:
            if self.node.broker is not None:
                self._start_broker()
            self._await_brokers()
            if self.node.files:  # a broker-only host starts nothing of the run
                model_dir = self._setup() if self.node.sets_up else self._await_setup()
                self._write_files(model_dir)
                for spec in service_specs(self.node, self.spec.cluster, self.config_dir):
                    self._start(spec)
            return self._supervise()
        finally:
            self._stop_all()

    # -- brokers and set-up ----------------------------------------------------------------------

    def _start_broker(self) -> None:
        from stacx.infra.services.kafka import prepare_cluster_broker

        argv = prepare_cluster_broker(self.node.broker)
        self._start(ServiceSpec(name="broker", program=argv[:1], args=argv[1:]), wait=False)

    def _await_brokers(self) -> None:
        """Until a quorum of the broker hosts answers (`brokers_needed`): a host (re)started
        while a broker host is down starts its services, as the cluster accepts writes."""
        from stacx.infra.services.reachability import kafka_problem

        want = brokers_needed(self.spec)
        deadline = time.monotonic() + self.spec.cluster.setup_timeout_s
        problem: str | None = "not asked yet"
        while time.monotonic() < deadline:
            self.supervisor.poll()
            problem = kafka_problem(self.spec.bootstrap_servers, timeout_s=5.0, min_brokers=want)
            if problem is None:
                log.info(
                    "node %s: %d broker(s) answer at %s",
                    self.node.host.name,
                    want,
                    self.spec.bootstrap_servers,
                )
                return
            time.sleep(1.0)
        raise PipelineError(
            f"node {self.node.host.name}: {want} of the broker(s) at {self.spec.bootstrap_servers} did not "
            f"answer within cluster.setup_timeout_s={self.spec.cluster.setup_timeout_s:.0f}s ({problem})"
        )

    def _setup(self) -> Path:
        """Topics, model, tasks and SFT, as the single-host pipeline sets them up; then the marker."""
        from stacx.infra.pipeline.orchestrator import Pipeline

        marker = self.layout.root / SETUP_MARKER
        if marker.is_file():  # a restarted node: the run is set up already
            return Path(json.loads(marker.read_text())["model_dir"])
        for d in (self.layout.config_dir, self.layout.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        # the shared topics (dead letters, schema catalogue, ...) a fresh cluster lacks, which
        # `stacx infra up` creates on one machine; under the same topic policy
        self._retrying(lambda: self._shared_topics())
        pipeline = Pipeline(self.spec, layout=self.layout)
        model_dir: Path = self._retrying(pipeline.set_up)
        marker.write_text(json.dumps({"run_id": self.layout.run_id, "model_dir": str(model_dir)}))
        return model_dir

    def _shared_topics(self) -> None:
        from stacx.infra.services.topics import ensure_topics

        ensure_topics(self.spec.bootstrap_servers, policy=self.spec.topics)

    def _retrying(self, step: Any) -> Any:
        """`step()`, again while the young cluster refuses topic creation (a broker still
        joining, a slow controller), until `cluster.setup_timeout_s`."""
        from stacx.infra.services.errors import InfraError

        deadline = time.monotonic() + self.spec.cluster.setup_timeout_s
        while True:
            try:
                return step()
            except InfraError as exc:
                if time.monotonic() > deadline:
                    raise PipelineError(f"node {self.node.host.name}: setting the run up: {exc}") from exc
                log.warning("node %s: %s; trying again", self.node.host.name, exc)
                time.sleep(5.0)

    def _await_setup(self) -> Path:
        marker = self.layout.root / SETUP_MARKER
        deadline = time.monotonic() + self.spec.cluster.setup_timeout_s
        while time.monotonic() < deadline:
            self.supervisor.poll()
            if marker.is_file():
                state = json.loads(marker.read_text())
                if state.get("run_id") == self.layout.run_id:
                    return Path(state["model_dir"])
            time.sleep(1.0)
        setup_host = self.spec.cluster.with_role("assembler")[0].name
        raise PipelineError(
            f"node {self.node.host.name}: {marker} did not appear within cluster.setup_timeout_s="
            f"{self.spec.cluster.setup_timeout_s:.0f}s; is `stacx node up --host {setup_host}` running, "
            f"and is {self.spec.pipeline.runs_dir} shared by the hosts?"
        )

    def _write_files(self, model_dir: Path) -> None:
        if model_dir != planned_model_dir(self.spec, self.layout):
            self.node = plan_node(self.spec, self.layout, self.node.host.name)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        for name, body in self.node.files.items():
            (self.config_dir / name).write_text(yaml.safe_dump(body, sort_keys=False))

    # -- services ----------------------------------------------------------------------------

    def _start(self, spec: ServiceSpec, *, wait: bool = True) -> None:
        spec.env.setdefault(TOKEN_ENV, self._token)
        spec.env.setdefault("STACX_RUN_ID", self.layout.run_id)
        spec.env.setdefault("STACX_NODE", self.node.host.name)
        service = ServiceProcess(spec, self.logs_dir).start()
        self.services[spec.name] = service
        self.supervisor.add(service)
        if wait:
            service.wait_ready(self.spec.pipeline.services.startup_timeout_s)

    def _supervise(self) -> int:
        trains = "trainer" in self.services
        log.info("node %s: running %s", self.node.host.name, ", ".join(self.services))
        while True:
            self.supervisor.poll()
            if trains and self.supervisor.finished("trainer"):
                log.info("node %s: the trainer finished", self.node.host.name)
                return 0
            time.sleep(1.0)

    def _stop_all(self) -> None:
        """The services signalled at once (this host's broker after them: they may still commit
        to it) and none restarted any more; each gets `STOP_GRACE_S`, or `GONE_GRACE_S` when no
        broker answers (a service would only wait for brokers that are gone)."""
        for name in list(self.services):
            self.supervisor.remove(name)
        services = [name for name in reversed(START_ORDER) if name in self.services and name != "broker"]
        if services:
            grace_s = STOP_GRACE_S if self._brokers_answer() else GONE_GRACE_S
            self._stop_together(services, grace_s)
        if "broker" in self.services:
            self._stop_together(["broker"], STOP_GRACE_S)

    def _stop_together(self, names: list[str], grace_s: float) -> None:
        for name in names:
            self.services[name].terminate()
        deadline = time.monotonic() + grace_s
        for name in names:
            try:
                self.services[name].stop(timeout_s=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # go on stopping the others
                log.warning("node %s: stopping %s: %s", self.node.host.name, name, exc)

    def _brokers_answer(self) -> bool:
        from stacx.infra.services.reachability import kafka_problem

        return kafka_problem(self.spec.bootstrap_servers, timeout_s=2.0, min_brokers=1) is None
