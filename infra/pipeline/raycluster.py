"""Ray placement: each pipeline service is a Ray actor that runs the service's command as a
process group on the node Ray chose (`placement: {kind: ray, address: ...}`).

    placement:
      kind: ray
      address: 10.0.0.1:6379            # an existing Ray cluster (`ray start --head` / KubeRay)
      services:
        gateway: {num_cpus: 1, resources: {docker: 1}}   # the node that offers a `docker` resource
        inference: {num_cpus: 2, num_gpus: 1}
        rollout: {num_cpus: 1, strategy: SPREAD}
      groups:
        trainer: {ranks: 2, bundle: {CPU: 1, GPU: 1}, strategy: PACK}

Ray only places and restarts processes; Kafka stays the only data path between services. On
the driver a `RayService` is a `ServiceProcess` whose child is a `RemoteChild`: the pipeline's
`Supervisor` keeps its restart budget, and a dead actor or node reads as a crash. The
replacement actor is placed by Ray on a live node. A remote pid is never signalled here:
every signal goes through the actor, which signals the process group it made on its node.
A rank group is one placement group whose bundle i runs rank i, with `MASTER_ADDR` the
address of bundle 0's node. `RayPlacement.close()` removes exactly the actors and placement
groups it made (never `ray stop`, which stops every Ray process of a machine).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stacx.infra.pipeline.errors import ServiceError
from stacx.infra.pipeline.services import ServiceProcess, ServiceSpec, stacx_argv

__all__ = [
    "NODE_IP",
    "LOST",
    "RankGroupConfig",
    "RayPlacement",
    "RayPlacementConfig",
    "RayService",
    "RemoteChild",
    "ServiceHost",
    "ServiceResources",
]

log = logging.getLogger(__name__)

NODE_IP = "{node_ip}"
"""Written in a service's arguments or environment: replaced by its node's address on the node
(a service binds to its node's address, e.g. `--host {node_ip}`)."""
LOST = -int(signal.SIGKILL)
"""The exit status of a service whose actor or node is gone."""
FORWARDED_ENV = ("PYTHONPATH",)
"""Variables of the driver's environment that every service gets (plug-in paths)."""
FORWARDED_PREFIXES = ("STACX_", "OTEL_")
CALL_TIMEOUT_S = 10.0
"""Longest wait for an actor's answer before the call counts as unanswered."""

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServiceResources(_Schema):
    """What one service's actor asks Ray for (`placement.services.<name>`)."""

    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs reserved on the service's node."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs reserved (Ray sets CUDA_VISIBLE_DEVICES for the service)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom resources, e.g. {docker: 1} for the host with a Docker engine."""
    strategy: Literal["DEFAULT", "SPREAD"] = "DEFAULT"
    """Ray's scheduling strategy of the actor (SPREAD: away from the other services)."""


class RankGroupConfig(_Schema):
    """Ranks of one role placed together (`placement.groups.<name>`): one bundle per rank."""

    ranks: int = Field(default=1, ge=1)
    """Number of ranks (processes, one per bundle)."""
    bundle: dict[str, float] = Field(default_factory=lambda: {"CPU": 1.0})
    """Resources of each rank's bundle, e.g. {CPU: 1, GPU: 1}."""
    strategy: Strategy = "PACK"
    """How Ray spreads the bundles over nodes (PACK: as few nodes as possible)."""
    master_port: int = Field(default=29500, ge=1, le=65535)
    """`MASTER_PORT` of the group's rendezvous on bundle 0's node."""

    @field_validator("bundle")
    @classmethod
    def _some_resource(cls, bundle: dict[str, float]) -> dict[str, float]:
        if not bundle or any(v < 0 for v in bundle.values()) or not any(v > 0 for v in bundle.values()):
            raise ValueError(f"a bundle needs a positive amount of some resource, e.g. {{CPU: 1}}; "
                             f"got {bundle}")
        return bundle


class RayPlacementConfig(_Schema):
    """The `placement:` section with `kind: ray`: the cluster and what each service asks of it."""

    kind: Literal["ray"] = "ray"
    address: str
    """Address of the Ray cluster's head (`HOST:PORT`, or `auto` on a node of the cluster)."""
    namespace: str = "stacx"
    """Ray namespace of the run's actors."""
    services: dict[str, ServiceResources] = Field(default_factory=dict)
    """Per service name (gateway, inference, assembler, rollout, ...); absent: 1 CPU."""
    groups: dict[str, RankGroupConfig] = Field(default_factory=dict)
    """Rank groups by name (trainer, or one per role: policy, critic, ...)."""
    start_timeout_s: float = Field(default=120.0, gt=0)
    """How long an actor may take to be placed and start its service."""

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        if address != "auto" and (":" not in address or not address.rsplit(":", 1)[1].isdigit()):
            raise ValueError(f"address {address!r}: write HOST:PORT of the Ray head "
                             "(e.g. 10.0.0.1:6379) or auto")
        return address


# --------------------------------------------------------------------------------- on the node


class ServiceHost:
    """The actor: runs one service's command as a process group on its node and answers for it."""

    def __init__(self) -> None:
        self.node_ip = _own_node_address()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(
        self, program: list[str] | None, args: list[str], env: dict[str, str], log_path: str
    ) -> tuple[int, str]:
        """Start the service (this node's `stacx` unless `program`); its pid and this node's address."""
        argv = [_on_node(a, self.node_ip) for a in [*(program or stacx_argv()), *args]]
        own = {k: _on_node(v, self.node_ip) for k, v in env.items()}
        full_env = {**os.environ, **own, "PYTHONUNBUFFERED": "1"}
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as out:
            out.write(f"$ {' '.join(argv)}  (ray node {self.node_ip})\n".encode())
            out.flush()
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self.proc.pid, self.node_ip

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal_group(self, sig: int) -> None:
        """Signal the service's process group (made by `start` on this node)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM to the group, SIGKILL to what is left after `timeout_s`; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)  # the group's leftovers (spawned ranks), or a stuck leader
        return self.proc.wait(timeout=10)


def _own_node_address() -> str:
    """The address this node joined the cluster with (`ray start --node-ip-address`), not the one
    a route to the internet would pick (`ray.util.get_node_ip_address` on a multi-homed host)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


def _on_node(text: str, node_ip: str) -> str:
    return text.replace(NODE_IP, node_ip)


# --------------------------------------------------------------------------------- on the driver


class NodeLostError(ServiceError):
    """The actor's node died before the service started (Ray had not marked it dead yet)."""


class RemoteChild:
    """`ChildProcess` of a service run by a `ServiceHost` actor; a dead actor or node is a crash
    with status `LOST`. `pid` is the pid on the service's node: for messages only."""

    def __init__(self, actor: Any, *, pid: int, node_ip: str, get: Callable[..., Any] | None = None) -> None:
        self.actor = actor
        self.pid = pid
        self.node_ip = node_ip
        self.returncode: int | None = None
        self._get = get
        """`ray.get` (a fake in unit tests)."""

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._ask("poll")
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"service on {self.node_ip} (pid {self.pid})", timeout or 0.0)
            time.sleep(0.2)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self._ask("signal_group", int(sig))

    def stop(self, timeout_s: float) -> None:
        """The actor stops the service's group on its node (a gone actor: nothing left to stop)."""
        status = self._ask("stop", timeout_s, wait_s=timeout_s + 15.0)
        if self.returncode is None and status is not None:
            self.returncode = status

    def _ask(self, method: str, *args: Any, wait_s: float = CALL_TIMEOUT_S) -> Any:
        """Call the actor; LOST when it or its node is gone, None when it does not answer in time
        (a slow or partitioned node: Ray marks it dead, and the next call reads LOST)."""
        from ray.exceptions import GetTimeoutError, RayActorError

        get = self._get or _ray_get()
        try:
            return get(getattr(self.actor, method).remote(*args), timeout=wait_s)
        except RayActorError:
            return LOST if method != "signal_group" else None
        except GetTimeoutError:
            log.warning("the actor of the service on %s did not answer %s within %.0fs",
                        self.node_ip, method, wait_s)
            return None


class RayService(ServiceProcess):
    """A `ServiceProcess` run by a Ray actor; each `start` places a fresh actor."""

    def __init__(self, spec: ServiceSpec, log_dir: Path, *, placement: RayPlacement,
                 bundle: tuple[Any, int] | None = None) -> None:
        super().__init__(spec, log_dir)
        self.template = spec
        """The spec as written; `spec` is it on the current node (`{node_ip}` in `ready_url` replaced)."""
        self.placement = placement
        self.bundle = bundle
        """(placement group, bundle index) of a rank, or None: placed by `placement.services`."""
        self.actor: Any = None

    @property
    def node_ip(self) -> str | None:
        return self.proc.node_ip if isinstance(self.proc, RemoteChild) else None

    def start(self) -> RayService:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        while True:
            self._release()
            self.actor = self.placement.new_actor(self.spec.name, self.bundle)
            try:
                self.proc = self.placement.start_on(self.actor, self.template, self.log_path)
                break
            except NodeLostError as exc:  # Ray places the next actor on a live node
                limit_s = self.placement.config.start_timeout_s
                if time.monotonic() - started >= limit_s:
                    raise ServiceError(f"{exc}; no live node took it within {limit_s:.0f}s") from exc
                log.warning("%s: placing it again", exc)
                time.sleep(1.0)
        url = self.template.ready_url
        here = None if url is None else _on_node(url, self.proc.node_ip)
        self.spec = replace(self.template, ready_url=here)
        log.info("started %s on ray node %s (pid %d there): %s", self.spec.name, self.proc.node_ip,
                 self.proc.pid, " ".join(self.spec.args))
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        if isinstance(self.proc, RemoteChild):
            self.proc.stop(timeout_s)
        self._release()

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)  # through the actor: never os.killpg with a remote pid

    def _kill_leftovers(self, grace_s: float = 0.0) -> None:
        self.stop(timeout_s=grace_s)

    def _release(self) -> None:
        if self.actor is not None:
            self.placement.kill(self.actor)
            self.actor = None


class RayPlacement:
    """A driver's connection to a Ray cluster; owns the actors and placement groups it made."""

    def __init__(self, config: RayPlacementConfig, *, run_id: str) -> None:
        import ray

        self.config = config
        self.run_id = run_id
        self._actors: dict[str, Any] = {}
        self._groups: list[Any] = []
        self._count = 0
        if not ray.is_initialized():
            ray.init(address=config.address, namespace=config.namespace, log_to_driver=False,
                     configure_logging=False)

    # -- services

    def service(self, spec: ServiceSpec, log_dir: Path) -> RayService:
        """`spec` as a Ray service (not started)."""
        spec.env = {**_forwarded_env(), **spec.env}
        return RayService(spec, log_dir, placement=self)

    def new_actor(self, name: str, bundle: tuple[Any, int] | None) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._count += 1
        options: dict[str, Any] = {"name": f"stacx-{self.run_id}-{name}-{self._count}",
                                   "max_restarts": 0, "max_concurrency": 4}
        if bundle is not None:
            group, index = bundle
            options.update(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=index,
                placement_group_capture_child_tasks=False))
        else:
            wanted = self.config.services.get(name, ServiceResources())
            options.update(num_cpus=wanted.num_cpus, num_gpus=wanted.num_gpus, resources=wanted.resources)
            if wanted.strategy == "SPREAD":
                options["scheduling_strategy"] = "SPREAD"
        actor = ray.remote(ServiceHost).options(**options).remote()
        self._actors[options["name"]] = actor
        return actor

    def start_on(self, actor: Any, spec: ServiceSpec, log_path: Path) -> RemoteChild:
        """Start `spec` in `actor`; ServiceError when Ray cannot place it in time."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        call = actor.start.remote(spec.program, spec.args, spec.env, str(log_path))
        try:
            pid, node_ip = ray.get(call, timeout=self.config.start_timeout_s)
        except RayActorError as exc:  # placed on a node that died before Ray marked it dead
            self.kill(actor)
            raise NodeLostError(f"placement.services.{spec.name}: its node died before it started") from exc
        except GetTimeoutError as exc:
            self.kill(actor)
            raise ServiceError(
                f"placement.services.{spec.name}: Ray did not place and start it within "
                f"{self.config.start_timeout_s:.0f}s ({type(exc).__name__}); check `ray status` for a "
                "node with the resources it asks for"
            ) from exc
        return RemoteChild(actor, pid=pid, node_ip=node_ip)

    def kill(self, actor: Any) -> None:
        import ray

        for name, known in list(self._actors.items()):
            if known is actor:
                del self._actors[name]
        try:
            ray.kill(actor, no_restart=True)
        except ValueError:
            pass  # not an actor handle of this job any more

    # -- rank groups

    def rank_group(self, name: str, spec: ServiceSpec, log_dir: Path) -> list[RayService]:
        """The ranks of group `name` running `spec`, one per bundle of a new placement group
        (not started); each gets RANK, WORLD_SIZE and MASTER_ADDR/PORT of bundle 0's node."""
        from ray.util.placement_group import placement_group

        if name not in self.config.groups:
            raise ServiceError(f"placement.groups: no group {name!r}; groups: {sorted(self.config.groups)}")
        cfg = self.config.groups[name]
        group = placement_group([dict(cfg.bundle) for _ in range(cfg.ranks)], strategy=cfg.strategy,
                                name=f"stacx-{self.run_id}-{name}")
        self._groups.append(group)
        if not group.wait(self.config.start_timeout_s):
            raise ServiceError(
                f"placement.groups.{name}: Ray could not reserve {cfg.ranks} bundle(s) of {cfg.bundle} "
                f"with {cfg.strategy} within {self.config.start_timeout_s:.0f}s; see `ray status`"
            )
        master = self.bundle_address(group, 0)
        ranks = []
        for rank in range(cfg.ranks):
            env = {**spec.env, "RANK": str(rank), "WORLD_SIZE": str(cfg.ranks), "LOCAL_RANK": "0",
                   "MASTER_ADDR": master, "MASTER_PORT": str(cfg.master_port)}
            rank_spec = ServiceSpec(name=f"{spec.name}-{rank}", args=list(spec.args), env=env,
                                    finishes=spec.finishes, program=spec.program, ready_url=spec.ready_url)
            ranks.append(RayService(rank_spec, log_dir, placement=self, bundle=(group, rank)))
        return ranks

    @staticmethod
    def bundle_address(group: Any, index: int) -> str:
        """The address of the node holding bundle `index` of `group` (Ray's placement table)."""
        import ray
        from ray.util import placement_group_table

        node_id = placement_group_table(group)["bundles_to_node_id"][index]
        for node in ray.nodes():
            if node["NodeID"] == node_id:
                return str(node["NodeManagerAddress"])
        raise ServiceError(f"placement group bundle {index} is on node {node_id}, which Ray no longer lists")

    # -- end

    def close(self) -> None:
        """Kill every actor and remove every placement group this placement made; disconnect."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in list(self._actors.values()):
            self.kill(actor)
        for group in self._groups:
            try:
                remove_placement_group(group)
            except Exception as exc:  # one group that cannot be removed must not keep the others
                log.warning("removing placement group %s: %s", group.id, exc)
        self._groups.clear()
        ray.shutdown()  # a driver of an existing cluster only disconnects


def _ray_get() -> Callable[..., Any]:
    import ray

    return ray.get


def _forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in FORWARDED_ENV or k.startswith(FORWARDED_PREFIXES)}
