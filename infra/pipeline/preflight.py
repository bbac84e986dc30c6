"""Before starting anything: is the config sound, and is every service, command and module the
pipeline needs here?

Config problems (`infra.pipeline.resolve.check_resolved`) come first and stop the run with
`PipelineConfigError`; then every missing component is collected and reported at once, each
naming what is missing and how to get it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from infra.pipeline.config import PipelineSpec
from infra.pipeline.errors import MissingComponentError
from infra.pipeline.layout import gateway_backend, service_urls

__all__ = ["COMMANDS", "MODULES", "check_all", "missing_commands", "missing_modules"]

MODULES: dict[str, str] = {
    "rollout.service": "rollout engine",
    "rollout.inference": "built-in inference server",
    "rollout.models": "tiny model factory",
    "consumers.weights": "weight subscriber",
    "consumers.assembly": "Faust batch assembler",
    "sandbox.gateway": "sandbox gateway",
    "trainer": "trainer engine",
    "producers": "event producers",
    "consumers": "event consumers",
}
"""Python modules the pipeline imports or runs, with who provides them."""

COMMANDS: dict[str, str] = {
    "serve": "`stacx serve` (inference server)",
    "gateway": "`stacx gateway` (sandbox gateway)",
    "assemble": "`stacx assemble` (batch assembler)",
    "train": "`stacx train` (trainer)",
    "rollout": "`stacx rollout` (rollout service)",
}
"""`stacx` subcommands the pipeline starts as services."""


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_modules(present: Callable[[str], bool] = _module_present) -> list[str]:
    return [f"python module `{name}` — the {what}" for name, what in MODULES.items() if not present(name)]


def _stacx_commands() -> set[str]:
    import argparse

    from infra.cli import build_parser

    parser = build_parser()
    names: set[str] = set()
    for action in parser._actions:  # argparse keeps sub-commands here; there is no public API
        if isinstance(action, argparse._SubParsersAction):
            names.update(action.choices)
    return names


def missing_commands(available: set[str] | None = None) -> list[str]:
    try:
        names = _stacx_commands() if available is None else available
    except Exception as exc:  # a broken command module breaks the whole CLI: say which
        return [f"a working `stacx` command line ({type(exc).__name__}: {exc})"]
    return [f"{what} — no `stacx {name}` subcommand" for name, what in COMMANDS.items() if name not in names]


def _kafka_problem(bootstrap: str) -> str | None:
    from infra.services.reachability import kafka_problem

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
    from infra.services.processes import port_holder, port_open

    problems = []
    inference_url, gateway_url = service_urls(spec)
    for what, url in (("gateway.port", gateway_url), ("inference.server.port", inference_url)):
        host, _, port = url.removeprefix("http://").rpartition(":")
        if port_open(host, int(port)):
            problems.append(
                f"a free port {port} for {what} (held by {port_holder(int(port))}); "
                "pick another one in the config"
            )
    return problems


def _topic_problems(spec: PipelineSpec) -> list[str]:
    """Topics the run reads but does not create: a mistyped name would be auto-created empty."""
    from infra.services.topics import missing_topics
    from schemas.topics import DLQ

    wanted = {str(spec.assembler.get("dlq_topic") or DLQ): "assembler.dlq_topic"}
    if spec.pipeline.tasks.topic:
        wanted[spec.pipeline.tasks.topic] = "pipeline.tasks.topic"
    missing = missing_topics(spec.bootstrap_servers, sorted(wanted)) or []
    return [
        f"the topic {name} ({wanted[name]}) on {spec.bootstrap_servers}: check the name, or create "
        "it (`stacx infra up` creates the standard topics)"
        for name in missing
    ]


def check_all(spec: PipelineSpec) -> None:
    """Raise PipelineConfigError for a config problem, else MissingComponentError naming
    everything that is missing."""
    from infra.pipeline.resolve import check_resolved

    check_resolved(spec)
    missing = missing_modules() + missing_commands()
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
