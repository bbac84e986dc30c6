"""`stacx gateway`, `stacx tasks check DIR`, `stacx tasks import DIR -o tasks.jsonl`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    gateway = subparsers.add_parser("gateway", help="run the sandbox gateway (HTTP)")
    gateway.add_argument("--host", default="127.0.0.1")
    gateway.add_argument("--port", type=int, default=8700)
    gateway.add_argument("--backend", choices=("docker", "process"), default="docker")
    gateway.add_argument("--token", help="bearer token (default: $STACX_SANDBOX_TOKEN, else generated)")
    gateway.add_argument("--no-auth", action="store_true", help="disable auth (loopback tests only)")
    gateway.add_argument("--owner", default="stacx-gateway", help="reaper ownership label")
    gateway.add_argument("--image", default="stacx/sandbox:bookworm", help="default image")
    gateway.add_argument("--max-sessions", type=int, default=512)
    gateway.add_argument("--idle-timeout", type=float, default=1800.0, help="seconds")
    gateway.add_argument("--max-lifetime", type=float, default=12 * 3600.0, help="seconds")
    gateway.add_argument("--warm-pool", type=int, default=0, help="pre-started sandboxes")
    gateway.add_argument(
        "--task-root", action="append", default=[], help="allowed task_dir root (repeatable; default any)"
    )
    gateway.set_defaults(func=_gateway)

    tasks = subparsers.add_parser("tasks", help="Harbor-format task directories")
    sub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="run oracle and no-op agent, print both rewards")
    check.add_argument("dir", type=Path, help="a task directory or a directory of tasks")
    check.add_argument("--json", action="store_true", help="print JSON lines")
    check.set_defaults(func=_tasks_check)
    imp = sub.add_parser("import", help="normalise task directories into TaskSample rows")
    imp.add_argument("dir", type=Path)
    imp.add_argument("-o", "--output", type=Path, required=True, help="tasks.jsonl to write")
    imp.set_defaults(func=_tasks_import)


def _gateway(args: argparse.Namespace) -> int:
    from sandbox.gateway import Gateway
    from sandbox.sessions import SessionManager

    sessions = SessionManager.Config(
        owner=args.owner,
        default_image=args.image,
        max_sessions=args.max_sessions,
        idle_timeout_s=args.idle_timeout,
        max_lifetime_s=args.max_lifetime,
        warm_pool_size=args.warm_pool,
        allowed_task_roots=tuple(args.task_root),
    )
    config = Gateway.Config(
        host=args.host,
        port=args.port,
        token=args.token,
        auth=not args.no_auth,
        backend=args.backend,
        sessions=sessions,
    )
    gateway = Gateway(config)
    if config.auth and not (args.token or _env_token()):
        print(f"sandbox gateway token: {gateway.token}", file=sys.stderr)
    gateway.run()
    return 0


def _env_token() -> str | None:
    from sandbox.gateway import TOKEN_ENV

    return os.environ.get(TOKEN_ENV)


def _tasks_check(args: argparse.Namespace) -> int:
    from sandbox.errors import SandboxError
    from sandbox.tasks import discover_tasks

    try:
        tasks = discover_tasks(args.dir)
        checks = asyncio.run(_run_checks(tasks))
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for check in checks:
        if args.json:
            print(json.dumps(dataclasses.asdict(check) | {"passed": check.passed}))
        else:
            status = "ok " if check.passed else "BAD"
            print(
                f"{status} {check.task}: oracle={check.oracle_reward} noop={check.noop_reward}"
                + (f"  ({check.error})" if check.error else "")
            )
    return 0 if all(c.passed for c in checks) else 1


async def _run_checks(tasks: list[Any]) -> list[Any]:
    from sandbox.backends import DockerBackend
    from sandbox.checks import check_task
    from sandbox.images import TaskImageBuilder
    from sandbox.sessions import SessionManager

    manager = SessionManager(
        # A unique owner per run (concurrent checks must not reap each other); a short lifetime
        # lets any gateway's reaper remove what a killed check left behind.
        SessionManager.Config(owner=f"stacx-tasks-check-{os.getpid()}", max_lifetime_s=3600.0),
        DockerBackend(),
        images=TaskImageBuilder(),
    )
    async with manager:
        try:
            return list(await asyncio.gather(*(check_task(manager, t) for t in tasks)))
        finally:
            await manager.backend.close()


def _tasks_import(args: argparse.Namespace) -> int:
    from sandbox.errors import SandboxError
    from sandbox.tasks import discover_tasks, to_task_sample

    try:
        tasks = discover_tasks(args.dir)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w") as out:
        for task in tasks:
            out.write(json.dumps(dataclasses.asdict(to_task_sample(task)), sort_keys=True) + "\n")
    print(f"wrote {len(tasks)} tasks to {args.output}", file=sys.stderr)
    return 0
