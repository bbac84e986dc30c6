"""`stacx infra up | down | status | smoke`: the local services."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacx.infra.config import ConfigError, build, load_yaml
from stacx.infra.services import smoke, stack
from stacx.infra.services.errors import InfraError
from stacx.schemas.topics import TopicPolicy


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "infra", help="local services: Kafka (KRaft), Docker engine, sandbox image, Jaeger"
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start Kafka and Docker, build the sandbox image, create topics")
    up.add_argument("--no-docker", action="store_true", help="no Docker engine and sandbox image")
    up.add_argument(
        "--no-trace-backend", action="store_true", help="no Jaeger (env STACX_TRACE_BACKEND=0 does the same)"
    )
    up.add_argument(
        "--no-browser",
        action="store_true",
        help="no Chromium for the web view's browser tests (env STACX_BROWSER_TOOLS=0 does the same)",
    )
    up.set_defaults(func=_up)
    actions.add_parser("down", help="stop the services `up` started").set_defaults(func=_down)
    status = actions.add_parser("status", help="what runs, where, and where its logs are")
    status.set_defaults(func=_status)
    smoke_ = actions.add_parser("smoke", help="round-trip a record through Kafka, run a sandbox command")
    smoke_.set_defaults(func=_smoke)
    for parser_ in (up, status, smoke_):
        parser_.add_argument(
            "--config",
            type=Path,
            default=None,
            help="YAML config; its `bootstrap_servers` selects an existing Kafka cluster",
        )


def _say(line: str) -> None:
    print(f"[stacx infra] {line}", flush=True)


def _guarded(fn):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except ConfigError as exc:
            for line in exc.lines:
                print(f"stacx infra: {line}", file=sys.stderr, flush=True)
            return 2
        except InfraError as exc:
            print(f"[stacx infra] error: {exc}", flush=True)
            return 1

    return run


@_guarded
def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    config = _stack_config(args)
    config.docker = not args.no_docker
    config.tracing_backend = config.tracing_backend and not args.no_trace_backend
    config.browser = config.browser and not args.no_browser
    stack.up(config, say=_say)
    _say(f"ready in {time.monotonic() - started:.1f}s (bootstrap {config.bootstrap})")
    return 0


@_guarded
def _down(args: argparse.Namespace) -> int:
    stack.down(say=_say)
    return 0


@_guarded
def _status(args: argparse.Namespace) -> int:
    lines = stack.status(_stack_config(args))
    for _, line in lines:
        _say(line)
    return 0 if all(healthy for healthy, _ in lines) else 1


@_guarded
def _smoke(args: argparse.Namespace) -> int:
    config = _stack_config(args)
    _say(smoke.kafka_round_trip(config.bootstrap))
    _say(smoke.sandbox_command())
    _say("smoke test passed (Kafka round trip and a sandbox command).")
    return 0


@dataclass(kw_only=True, slots=True)
class _StackFile:
    """What `stacx infra` reads of a `--config` file (a pipeline, service or stack file): its
    `bootstrap_servers` and `topics`; the other sections are their commands' (checked there)."""

    bootstrap_servers: str | None = None
    """Kafka bootstrap servers (host:port[,host:port]) of an existing cluster."""
    topics: TopicPolicy = field(default_factory=TopicPolicy)
    """Replication, partitions, retention and compression of the standard topics."""
    pipeline: Any = None
    gateway: Any = None
    inference: Any = None
    rollout: Any = None
    assembler: Any = None
    trainer: Any = None
    resources: Any = None
    cluster: Any = None
    proxy: Any = None
    join: Any = None
    oncall: Any = None
    evaluation: Any = None
    replay: Any = None
    placement: Any = None


def _stack_config(args: argparse.Namespace) -> stack.StackConfig:
    config = stack.StackConfig()
    if getattr(args, "config", None) is not None:
        stack_file = build(_StackFile, load_yaml(args.config), where=str(args.config))
        if stack_file.bootstrap_servers:
            config.bootstrap_servers = stack_file.bootstrap_servers
        config.topics = stack_file.topics
    return config
