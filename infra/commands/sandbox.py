"""`stacx gateway`, `stacx tasks check DIR`, `stacx tasks import DIR -o tasks.jsonl`,
`stacx tasks images [build]` (local stand-ins for public base images, offline verifier tools)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from stacx.infra.heap import freeze_startup_heap


def register(subparsers: Any) -> None:
    gateway = subparsers.add_parser("gateway", help="run the sandbox gateway (HTTP)")
    gateway.add_argument("--config", help="YAML file whose `gateway:` section configures the gateway")
    gateway.add_argument("--host", help="default 127.0.0.1")
    gateway.add_argument("--port", type=int, help="default 8700")
    gateway.add_argument("--backend", choices=("docker", "process"), help="default docker")
    gateway.add_argument("--token", help="bearer token (default: $STACX_SANDBOX_TOKEN, else generated)")
    gateway.add_argument(
        "--no-auth", dest="auth", action="store_false", default=None, help="no auth (loopback tests only)"
    )
    gateway.add_argument("--owner", help="reaper ownership label (default stacx-gateway)")
    gateway.add_argument("--image", help="default image (stacx/sandbox:bookworm)")
    gateway.add_argument("--max-sessions", type=int, help="default 512")
    gateway.add_argument("--idle-timeout", type=float, help="seconds (default 1800)")
    gateway.add_argument("--max-lifetime", type=float, help="seconds (default 12 h)")
    gateway.add_argument("--warm-pool", type=int, help="pre-started sandboxes (default 0)")
    gateway.add_argument(
        "--python-dir",
        metavar="DIR",
        help="directory of Python installations for Harbor verifiers (read-only)",
    )
    gateway.add_argument(
        "--reuse-pool",
        type=int,
        help="closed sessions' sandboxes kept, reset, for the next session of the same shape (0: none)",
    )
    gateway.add_argument("--task-root", action="append", help="allowed task_dir root (repeatable; any)")
    gateway.add_argument(
        "--client-token", action="append", help="client token (repeatable): its own sessions only"
    )
    limits = gateway.add_argument_group("limits", "operator-owned maxima per session, budget of all")
    limits.add_argument("--max-cpus", type=float, help="CPU quota per session (default: host cores)")
    limits.add_argument("--max-memory-mb", type=int, help="memory limit per session (default: budget)")
    limits.add_argument("--max-pids", type=int, help="pids limit per session (default 1024)")
    limits.add_argument("--budget-pids", type=int, help="sum of pids limits (default: 3/4 of pid_max)")
    limits.add_argument("--budget-memory-mb", type=int, help="sum of memory limits (default: host memory)")
    limits.add_argument("--memory-overcommit", type=float, help="budget / host memory allowed (default 1)")
    gateway.set_defaults(func=_gateway)

    tasks = subparsers.add_parser("tasks", help="Harbor-format task directories")
    sub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="run oracle and no-op agent, print both rewards")
    check.add_argument("dir", type=Path, help="a task directory or a directory of tasks")
    check.add_argument("--json", action="store_true", help="print JSON lines")
    check.add_argument("--jobs", "-j", type=int, default=2, help="tasks checked at once (default 2)")
    check.add_argument(
        "--base-image",
        action="append",
        default=[],
        metavar="FROM=LOCAL",
        help="map a FROM image to a local one (repeatable; adds to the default map)",
    )
    check.add_argument(
        "--python-dir",
        metavar="DIR",
        help="Python installations for test.sh's `uvx -p 3.12` (`uv python install --install-dir DIR`)",
    )
    check.set_defaults(func=_tasks_check)
    imp = sub.add_parser("import", help="normalise task directories into TaskSample rows")
    imp.add_argument("dir", type=Path)
    imp.add_argument("-o", "--output", type=Path, required=True, help="tasks.jsonl to write")
    imp.set_defaults(func=_tasks_import)
    images = sub.add_parser("images", help="the base-image map and the local stand-in images")
    images.add_argument("action", nargs="?", choices=("list", "build"), default="list")
    images.add_argument("names", nargs="*", help="images to build (default: all)")
    images.set_defaults(func=_tasks_images)


GATEWAY_FLAGS = {
    "host": "host",
    "port": "port",
    "backend": "backend",
    "token": "token",
    "auth": "auth",
    "client_token": "client_tokens",
    "python_dir": "python_dir",
    "owner": "sessions.owner",
    "image": "sessions.default_image",
    "max_sessions": "sessions.max_sessions",
    "idle_timeout": "sessions.idle_timeout_s",
    "max_lifetime": "sessions.max_lifetime_s",
    "warm_pool": "sessions.warm_pool_size",
    "reuse_pool": "sessions.reuse_pool_size",
    "task_root": "sessions.allowed_task_roots",
    "max_cpus": "sessions.limits.max_cpus",
    "max_memory_mb": "sessions.limits.max_memory_mb",
    "max_pids": "sessions.limits.max_pids",
    "budget_pids": "sessions.limits.budget_pids",
    "budget_memory_mb": "sessions.limits.budget_memory_mb",
    "memory_overcommit": "sessions.limits.memory_overcommit",
}
"""Each flag of `stacx gateway` and the field of the `gateway:` section it overrides."""


def gateway_config(args: argparse.Namespace) -> Any:
    """`Gateway.Config` from the `gateway:` section of `--config` (if any) with the flags on top."""
    from stacx.infra.config import section_with_overrides
    from stacx.sandbox.gateway import Gateway

    return section_with_overrides(args, "gateway", Gateway.Config, GATEWAY_FLAGS)


def _gateway(args: argparse.Namespace) -> int:
    from stacx.infra.config import ConfigError
    from stacx.sandbox.errors import GatewayConfigError

    try:
        config = gateway_config(args)
        return _serve_gateway(config)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"stacx gateway: {line}", file=sys.stderr)
        return 2
    except GatewayConfigError as exc:
        print(f"stacx gateway: {exc}", file=sys.stderr)
        return 2


def _serve_gateway(config: Any) -> int:
    from stacx.sandbox.gateway import Gateway

    gateway = Gateway(config)
    if config.auth and not (config.token or _env_token()):
        print(f"sandbox gateway token: {gateway.token}", file=sys.stderr)
    freeze_startup_heap("gateway")
    gateway.run()
    return 0


def _env_token() -> str | None:
    from stacx.sandbox.gateway import TOKEN_ENV

    return os.environ.get(TOKEN_ENV)


def _base_images(pairs: list[str]) -> dict[str, str]:
    """The base-image map: the `--base-image FROM=LOCAL` pairs in the order given (FROM may be an
    fnmatch pattern such as `python:*`; the first match wins), then the defaults they do not
    replace."""
    from stacx.sandbox.images import DEFAULT_BASE_IMAGES

    given: dict[str, str] = {}
    for pair in pairs:
        source, sep, local = pair.partition("=")
        if not sep or not source or not local:
            raise ValueError(
                f"--base-image takes FROM=LOCAL (e.g. ubuntu:24.04=my/ubuntu:24.04 or python:*=my/python), "
                f"got {pair!r}"
            )
        if any(c in local for c in "*?["):
            raise ValueError(
                f"--base-image {pair!r}: LOCAL must be one image, not a pattern; only FROM may hold * ? [...]"
            )
        given.setdefault(source, local)
    return given | {k: v for k, v in DEFAULT_BASE_IMAGES.items() if k not in given}


def _tasks_check(args: argparse.Namespace) -> int:
    from stacx.sandbox.errors import SandboxError
    from stacx.sandbox.tasks import find_task_dirs

    try:
        base_images = _base_images(args.base_image)
        directories = find_task_dirs(args.dir)
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        checks = asyncio.run(
            _run_checks(directories, base_images, args.jobs, as_json=args.json, python_dir=args.python_dir)
        )
    except (SandboxError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    passed = sum(c.passed for c in checks)
    if not args.json:
        print(f"{passed}/{len(checks)} tasks passed (oracle 1.0, no-op 0.0)")
    return 0 if passed == len(checks) else 1


async def _run_checks(
    directories: list[Path], base_images: dict[str, str], jobs: int, *, as_json: bool, python_dir: str | None
) -> list[Any]:
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.checks import check_path
    from stacx.sandbox.images import TaskImageBuilder
    from stacx.sandbox.sessions import SessionManager

    manager = SessionManager(
        # A unique owner per run (concurrent checks must not reap each other); a short lifetime
        # lets any gateway's reaper remove what a killed check left behind.
        SessionManager.Config(owner=f"stacx-tasks-check-{os.getpid()}", max_lifetime_s=3600.0),
        DockerBackend(),
        images=TaskImageBuilder(TaskImageBuilder.Config(base_images=base_images, python_dir=python_dir)),
    )
    limit = asyncio.Semaphore(jobs)

    async def one(directory: Path) -> Any:
        async with limit:
            check = await check_path(manager, directory)
        print(json.dumps(check.as_json()) if as_json else _describe(check), flush=True)
        return check

    try:
        async with manager:  # stops every session, also when the check is interrupted
            return list(await asyncio.gather(*(one(d) for d in directories)))
    finally:
        await manager.backend.close()


def _describe(check: Any) -> str:
    """Human-readable lines for one TaskCheck."""
    status = "ok " if check.passed else "BAD"
    lines = [
        f"{status} {check.task}: oracle={check.oracle_reward} noop={check.noop_reward} ({check.duration_s}s)",
        f"    path {check.path}",
    ]
    if check.image:
        lines.append(f"    image {check.image}")
    if check.fields:
        lines.append("    " + " ".join(f"{k}={v}" for k, v in check.fields.items() if v not in (None, False)))
    if check.oracle_steps:
        lines.append("    oracle per step: " + " ".join(f"{k}={v}" for k, v in check.oracle_steps.items()))
    if len(check.oracle_rewards) > 1:
        lines.append("    oracle rewards: " + " ".join(f"{k}={v}" for k, v in check.oracle_rewards.items()))
    lines += [f"    warning: {w}" for w in check.warnings]
    if check.error:
        lines.append(f"    error: {check.error}")
    if check.needs_python:
        lines.append(f"    {check.needs_python}")
    if check.needs_network:
        lines.append(f"    {check.needs_network}")
    if check.output_tail and not check.passed:
        lines.append("    test.sh output (tail):")
        lines += [f"      | {line}" for line in check.output_tail.splitlines()[-15:]]
    return "\n".join(lines)


def _tasks_images(args: argparse.Namespace) -> int:
    from stacx.infra.services import harbor_images
    from stacx.infra.services.errors import InfraError
    from stacx.infra.services.sandbox_image import image_exists
    from stacx.sandbox.images import DEFAULT_BASE_IMAGES

    if args.action == "build":
        try:
            harbor_images.build(
                args.names or None, say=lambda line: print(f"[stacx tasks] {line}", flush=True)
            )
        except InfraError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    for source, local in DEFAULT_BASE_IMAGES.items():
        print(f"FROM {source:<18} -> {local}")
    for name, what in harbor_images.STAND_INS.items():
        print(f"{name:<30} {'present' if image_exists(name) else 'missing':<8} {what}")
    return 0


def _tasks_import(args: argparse.Namespace) -> int:
    from stacx.sandbox.errors import SandboxError
    from stacx.sandbox.tasks import discover_tasks, to_task_sample

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
