"""`stacx infra up | down | status | smoke`: the local services."""

from __future__ import annotations

import argparse
import time

from infra.services import smoke, stack
from infra.services.errors import InfraError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("infra", help="local services: Kafka (KRaft), Docker engine, sandbox image")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start Kafka and Docker, build the sandbox image, create topics")
    up.add_argument("--no-docker", action="store_true", help="Kafka only")
    up.set_defaults(func=_up)
    actions.add_parser("down", help="stop the services `up` started").set_defaults(func=_down)
    actions.add_parser("status", help="what runs, where, and where its logs are").set_defaults(
        func=_status)
    actions.add_parser("smoke", help="round-trip a record through Kafka, run a sandbox command"
                       ).set_defaults(func=_smoke)


def _say(line: str) -> None:
    print(f"[stacx infra] {line}", flush=True)


def _guarded(fn):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except InfraError as exc:
            print(f"[stacx infra] error: {exc}", flush=True)
            return 1
    return run


@_guarded
def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    config = stack.StackConfig(docker=not args.no_docker)
    stack.up(config, say=_say)
    _say(f"ready in {time.monotonic() - started:.1f}s (bootstrap {config.bootstrap})")
    return 0


@_guarded
def _down(args: argparse.Namespace) -> int:
    stack.down(say=_say)
    return 0


@_guarded
def _status(args: argparse.Namespace) -> int:
    lines = stack.status(stack.StackConfig())
    for _, line in lines:
        _say(line)
    return 0 if all(healthy for healthy, _ in lines) else 1


@_guarded
def _smoke(args: argparse.Namespace) -> int:
    config = stack.StackConfig()
    _say(smoke.kafka_round_trip(config.bootstrap))
    _say(smoke.sandbox_command())
    _say("smoke test passed. The quickstart (`stacx quickstart`) is not built yet: "
         "this smoke test stands in for it in `make demo`.")
    return 0
