"""Before starting anything: is every service, command and module the pipeline needs here?

All problems are collected and reported at once, each naming what is missing and how to get it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from infra.pipeline.config import PipelineSpec
from infra.pipeline.errors import MissingComponentError

__all__ = ["COMMANDS", "MODULES", "check_all", "missing_commands", "missing_modules"]

MODULES: dict[str, str] = {
    "rollout.service": "rollout engine (issue 6)",
    "rollout.inference": "built-in inference server (issue 5)",
    "rollout.models": "tiny model factory (issue 5)",
    "consumers.weights": "weight subscriber (issue 5)",
    "consumers.assembly": "Faust batch assembler (issue 8)",
    "sandbox.gateway": "sandbox gateway (issue 4)",
    "trainer": "trainer engine (issue 7)",
    "producers": "event producers (issue 3)",
    "consumers": "event consumers (issue 3)",
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
    from infra.services.kafka import broker_answers

    if broker_answers(bootstrap, timeout_s=5.0):
        return None
    return f"a Kafka broker at {bootstrap} (start it with `stacx infra up`)"


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

    services = spec.pipeline.services
    problems = []
    for what, port in (("gateway_port", services.gateway_port), ("inference_port", services.inference_port)):
        if port_open(services.host, port):
            problems.append(
                f"a free port {port} for pipeline.services.{what} (held by "
                f"{port_holder(port)}); pick another one in the config"
            )
    return problems


def check_all(spec: PipelineSpec) -> None:
    """Raise MissingComponentError naming everything that is missing."""
    missing = missing_modules() + missing_commands()
    kafka = _kafka_problem(spec.bootstrap_servers)
    if kafka:
        missing.append(kafka)
    if spec.pipeline.services.gateway_backend == "docker":
        image = str((spec.rollout.get("sandbox") or {}).get("image", "stacx/sandbox:bookworm"))
        docker_problem = _docker_problem(image)
        if docker_problem:
            missing.append(docker_problem)
    missing += _ports_problems(spec)
    if missing:
        raise MissingComponentError(missing)
