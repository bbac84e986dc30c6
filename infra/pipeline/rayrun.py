"""The pipeline with its services placed by Ray (`stacx run CONFIG --ray ADDRESS`, or a
`placement: {kind: ray, ...}` section): the same stages as `stacx run`, each service a Ray actor
(`stacx.infra.pipeline.raycluster`).

The gateway and the inference server bind to their node's address; their URLs are read from
the node Ray chose, before the configs that name them (rollout's) are written. When one of them
is restarted on another node, the rollout service gets a config with the new URL and is
restarted too. The run's folder (`pipeline.runs_dir`: models, checkpoints, logs) must be the same
path on every node (one shared file system), as on the node-agent path; every node runs the same
STACX install.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from stacx.infra.pipeline.errors import PipelineConfigError
from stacx.infra.pipeline.layout import RunLayout, gateway_section, inference_services
from stacx.infra.pipeline.orchestrator import Pipeline
from stacx.infra.pipeline.raycluster import NODE_IP, RayPlacement, RayService
from stacx.infra.pipeline.services import ServiceProcess, ServiceSpec, Supervisor

__all__ = ["RayPipeline"]

log = logging.getLogger(__name__)

ADDRESSED = ("gateway", "inference")
"""Services whose address other services are configured with."""


class _WatchingSupervisor(Supervisor):
    """A Supervisor that tells its pipeline which services it restarted."""

    pipeline: RayPipeline

    def poll(self) -> list[str]:
        restarted = super().poll()
        if restarted:
            self.pipeline.restarted(restarted)
        return restarted


class RayPipeline(Pipeline):
    """`Pipeline` whose services are Ray actors; see the module docstring."""

    def __init__(self, spec: Any, *, layout: RunLayout | None = None) -> None:
        super().__init__(spec, layout=layout)
        if spec.placement is None:
            raise PipelineConfigError(f"{spec.source}: placement: a Ray run needs `placement: {{kind: ray}}`")
        supervisor = _WatchingSupervisor(self.cfg.services.restarts)
        supervisor.pipeline = self
        self.supervisor = supervisor
        self.ray: RayPlacement | None = None
        self._sft_model: Path | None = None

    def _start_preloader(self, model_dir: Path) -> None:
        """No preloader: it forks on the driver's machine, and Ray places every service."""

    def _start(self, spec: ServiceSpec, *, wait: bool = True) -> ServiceProcess:
        if self.ray is None:
            assert self.spec.placement is not None
            self.ray = RayPlacement(self.spec.placement, run_id=self.layout.run_id)
        for name, value in self._run_env().items():
            spec.env.setdefault(name, value)
        service = self.ray.service(spec, self.layout.logs_dir).start()
        self.services[spec.name] = service
        self.supervisor.add(service)
        self._bind(service)
        if wait:
            service.wait_ready(self.cfg.services.startup_timeout_s)
        return service

    def _start_serving(self, sft_dir: Path) -> None:
        """The gateway and the server first (their URLs are their nodes'), then the learners."""
        self.metrics.stage = "placing the sandbox gateway and the inference server on the Ray cluster"
        self._sft_model = sft_dir
        servers = inference_services(self.spec, self.layout, model_dir=sft_dir)
        if len(servers) != 1:
            raise PipelineConfigError(
                f"{self.spec.source}: inference.servers: a Ray run starts one inference server "
                f"(got {len(servers)}); set inference.servers: 1"
            )
        cfg_dir = self.layout.config_dir
        section = gateway_section(self.spec, self.layout)
        gateway = self._write_yaml(cfg_dir / "gateway.yaml", {"gateway": section})
        port = section["port"]
        self._start(ServiceSpec(name="gateway", args=["gateway", "--config", str(gateway), "--host", NODE_IP],
                                ready_url=f"http://{NODE_IP}:{port}/healthz"), wait=False)
        server = servers[0]
        path = self._write_yaml(cfg_dir / "inference.yaml", {"inference": server.section})
        port = server.section["server"]["port"]
        ready = f"http://{NODE_IP}:{port}{server.ready_path}"
        self._start(ServiceSpec(name="inference", args=["serve", "--config", str(path), "--host", NODE_IP],
                                ready_url=ready, env=dict(server.env)), wait=False)
        for spec in self._learner_specs(sft_dir):
            self._start(spec, wait=False)
        for name in ("gateway", "inference"):
            self.services[name].wait_ready(self.cfg.services.startup_timeout_s)

    def _bind(self, service: ServiceProcess) -> None:
        """Point the run's URLs at the node an addressed service runs on."""
        if not isinstance(service, RayService) or service.spec.name not in ADDRESSED or not service.node_ip:
            return
        if service.spec.name == "gateway":
            self.spec.gateway = {**self.spec.gateway, "host": service.node_ip}
        else:
            server = {**(self.spec.inference.get("server") or {}), "host": service.node_ip}
            self.spec.inference = {**self.spec.inference, "server": server}

    def restarted(self, names: list[str]) -> None:
        """A restarted gateway or server may be on another node: rollout gets its new URL."""
        moved = False
        for name in names:
            service = self.services[name]
            before = self.gateway_url if name == "gateway" else self.inference_url
            self._bind(service)
            after = self.gateway_url if name == "gateway" else self.inference_url
            moved |= name in ADDRESSED and before != after
        if moved and "rollout" in self.services and self._sft_model is not None:
            log.warning("gateway or server moved (%s, %s): restarting rollout with the new URLs",
                        self.gateway_url, self.inference_url)
            self._learner_specs(self._sft_model)  # rewrites the configs with the current URLs
            self.services["rollout"].stop()
            self.services["rollout"].start()

    def _shutdown(self) -> None:
        try:
            super()._shutdown()
        finally:
            if self.ray is not None:
                with contextlib.suppress(Exception):
                    self.ray.close()
