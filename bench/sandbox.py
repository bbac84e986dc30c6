"""Sandbox gateway benchmark: N concurrent sessions (default 64, 128, 256), each running K exec
steps through the gateway, against raw `docker exec` into the same containers in the same run.

Sessions ramp up (64 started, then 64 more, then 128 more) and stay alive, so the last level has
all N sessions running at once. Execs (gateway and raw) run with the same number in flight
(`--exec-concurrency`, default min(N, 32): hundreds of `docker` CLI processes would exhaust the
memory of a small machine). Prints JSON; the last line is the figure object:
max_concurrent_sessions, start_p50_s, exec_p50_ms, raw_exec_p50_ms, exec_ratio (gateway/raw),
leaked_containers (after the gateway shut down), lifecycle_concurrency (container create/start/remove
calls the Docker backend lets run at once), and per-level runs.

`--sweep 1,2,4,8` first measures create+exec+remove cycles per second at each lifecycle concurrency
(64 cycles each, straight on the backend): the figure behind `DockerBackend.Config.lifecycle_concurrency`.

    .venv/bin/python bench/sandbox.py --json [--sessions 64,128,256] [--steps 5] [--sweep 1,2,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx.sandbox.backends import DockerBackend  # noqa: E402
from stacx.sandbox.backends.docker import LABEL_OWNER, LABEL_SESSION  # noqa: E402
from stacx.sandbox.client import SandboxClient  # noqa: E402
from stacx.sandbox.limits import SessionLimits  # noqa: E402
from stacx.sandbox.models import ExecRequest, SessionSpec  # noqa: E402
from stacx.sandbox.protocols import SandboxSpec  # noqa: E402
from stacx.sandbox.sessions import SessionManager  # noqa: E402
from stacx.sandbox.testing import serve_gateway  # noqa: E402

COMMAND = "echo step"
BENCH_PIDS = 64
"""Pids limit per session: 256 sessions x 64 stay within a pid_max of 32768's budget."""
TARGET_SESSIONS, TARGET_RATIO = 256, 1.25


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="64,128,256", help="comma-separated levels N")
    parser.add_argument("--steps", type=int, default=2, help="exec steps K per session and method")
    parser.add_argument("--exec-concurrency", type=int, default=32, help="execs in flight")
    parser.add_argument("--image", default="stacx/sandbox:bookworm")
    parser.add_argument("--memory-mb", type=int, default=256, help="per-session memory limit")
    parser.add_argument("--json", action="store_true", help="print only JSON lines")
    parser.add_argument(
        "--lifecycle-concurrency",
        type=int,
        default=DockerBackend.Config().lifecycle_concurrency,
        help="container create/start/remove calls in flight (DockerBackend.Config)",
    )
    parser.add_argument("--sweep", default="", help="lifecycle concurrencies to measure first, e.g. 1,2,4,8")
    parser.add_argument("--sweep-cycles", type=int, default=64, help="create+exec+remove cycles per level")
    return parser.parse_args()


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def _start(
    client: SandboxClient, count: int, memory_mb: int, image: str
) -> tuple[list[str], list[float]]:
    async def one() -> tuple[str, float]:
        started = time.monotonic()
        spec = SessionSpec(image=image, memory_mb=memory_mb, cpus=0.5, pids=BENCH_PIDS)
        info = await client.create_session(spec)
        return info.id, time.monotonic() - started

    results = await asyncio.gather(*(one() for _ in range(count)))
    return [sid for sid, _ in results], [t for _, t in results]


async def _gateway_execs(client: SandboxClient, ids: list[str], steps: int, limit: int) -> list[float]:
    gate = asyncio.Semaphore(limit)
    latencies: list[float] = []

    async def one(sid: str) -> None:
        async with gate:
            started = time.monotonic()
            result = await client.exec(sid, COMMAND, timeout_s=120)
            latencies.append(time.monotonic() - started)
            if result.stdout != "step\n":
                raise RuntimeError(f"gateway exec in {sid} returned {result}")

    await asyncio.gather(*(one(sid) for sid in ids for _ in range(steps)))
    return latencies


async def _raw_execs(containers: list[str], steps: int, limit: int) -> list[float]:
    gate = asyncio.Semaphore(limit)
    latencies: list[float] = []

    async def one(cid: str) -> None:
        async with gate:
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                "docker",
                "exec",
                cid,
                "bash",
                "-c",
                COMMAND,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await proc.communicate()
            latencies.append(time.monotonic() - started)
            if out != b"step\n":
                raise RuntimeError(f"docker exec {cid[:12]} failed: {err.decode()[-300:]}")

    await asyncio.gather(*(one(cid) for cid in containers for _ in range(steps)))
    return latencies


def _container_ids(docker_client: Any, owner: str) -> dict[str, str]:
    found = docker_client.containers.list(filters={"label": f"{LABEL_OWNER}={owner}"})
    return {c.labels[LABEL_SESSION]: c.id for c in found}


async def _level(
    client: SandboxClient,
    args: argparse.Namespace,
    ids: list[str],
    target: int,
    owner: str,
    docker_client: Any,
) -> dict[str, Any]:
    new_ids, start_times = await _start(client, target - len(ids), args.memory_mb, args.image)
    ids.extend(new_ids)
    limit = min(target, args.exec_concurrency)
    gateway = await _gateway_execs(client, ids, args.steps, limit)
    containers = list(_container_ids(docker_client, owner).values())
    raw = await _raw_execs(containers, args.steps, limit)
    exec_p50, raw_p50 = _p50(gateway) * 1000, _p50(raw) * 1000
    return {
        "sessions": target,
        "live_containers": len(containers),
        "started_now": len(new_ids),
        "start_p50_s": round(_p50(start_times), 3),
        "start_max_s": round(max(start_times, default=0.0), 3),
        "exec_concurrency": limit,
        "execs": len(gateway),
        "exec_p50_ms": round(exec_p50, 2),
        "raw_exec_p50_ms": round(raw_p50, 2),
        "exec_ratio": round(exec_p50 / raw_p50, 3),
    }


async def _cycles(concurrency: int, cycles: int, image: str) -> dict[str, Any]:
    """`cycles` create+exec+remove cycles, all submitted at once, at one lifecycle concurrency."""
    backend = DockerBackend(DockerBackend.Config(lifecycle_concurrency=concurrency))
    owner = f"bench-sweep-{uuid.uuid4().hex[:8]}"

    async def one(i: int) -> None:
        spec = SandboxSpec(
            session_id=f"s{i}",
            image=image,
            workdir="/workspace",
            owner=owner,
            instance="bench",
            expires_at=time.time() + 600,
            memory_mb=128,
            cpus=0.5,
            pids=64,
            env={},
        )
        handle = await backend.start(spec)
        try:
            await backend.exec(handle, ExecRequest(command=COMMAND, timeout_s=30), max_output_bytes=1024)
        finally:
            await backend.stop(handle)

    started = time.monotonic()
    results = await asyncio.gather(*(one(i) for i in range(cycles)), return_exceptions=True)
    wall = time.monotonic() - started
    await backend.close()
    failures = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return {
        "lifecycle_concurrency": concurrency,
        "cycles": cycles,
        "cycles_per_s": round((cycles - len(failures)) / wall, 2),
        "failed": len(failures),
        "first_failure": failures[0] if failures else None,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    import docker

    docker_client = docker.from_env()
    levels = sorted(int(n) for n in args.sessions.split(","))
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    backend = DockerBackend(DockerBackend.Config(lifecycle_concurrency=args.lifecycle_concurrency))
    # the sessions' memory limits may add up past the host's memory: they idle in `sleep`
    held_mb = max(levels) * args.memory_mb
    limits = SessionLimits.Config(memory_overcommit=max(1.0, held_mb / backend.capacity.memory_mb))
    config = SessionManager.Config(
        owner=owner, default_image=args.image, max_sessions=max(levels), limits=limits
    )
    runs: list[dict[str, Any]] = []
    sweep = []
    for level in (int(n) for n in args.sweep.split(",") if n):
        sweep.append(await _cycles(level, args.sweep_cycles, args.image))
        if not args.json:
            print(json.dumps(sweep[-1]), file=sys.stderr)
    error = None
    with serve_gateway(backend, token="bench", config=config) as url:
        client_config = SandboxClient.Config(base_url=url, token="bench", timeout_s=600)
        async with SandboxClient(client_config) as client:
            ids: list[str] = []
            try:
                for target in levels:
                    runs.append(await _level(client, args, ids, target, owner, docker_client))
                    if not args.json:
                        print(json.dumps(runs[-1]), file=sys.stderr)
            except Exception as exc:  # report how far it got
                error = f"{type(exc).__name__}: {exc}"
            finally:
                await asyncio.gather(*(client.close_session(sid) for sid in ids), return_exceptions=True)
    leaked = len(docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"}))
    last = runs[-1] if runs else {}
    figures = {
        "max_concurrent_sessions": max((r["live_containers"] for r in runs), default=0),
        "start_p50_s": last.get("start_p50_s"),
        "exec_p50_ms": last.get("exec_p50_ms"),
        "raw_exec_p50_ms": last.get("raw_exec_p50_ms"),
        "exec_ratio": last.get("exec_ratio"),
        "leaked_containers": leaked,
        "lifecycle_concurrency": args.lifecycle_concurrency,
        "lifecycle_sweep": sweep,
        "steps": args.steps,
        "runs": runs,
        "error": error,
    }
    figures["targets"] = {
        "max_concurrent_sessions": f">= {TARGET_SESSIONS}",
        "exec_ratio": f"<= {TARGET_RATIO}",
        "leaked_containers": "== 0",
    }
    figures["pass"] = bool(
        error is None
        and figures["max_concurrent_sessions"] >= min(TARGET_SESSIONS, max(levels))
        and (figures["exec_ratio"] or 99) <= TARGET_RATIO
        and leaked == 0
    )
    return figures


def main() -> None:
    args = _parse()
    print(json.dumps(asyncio.run(_run(args))))


if __name__ == "__main__":
    main()
