"""Sandbox reuse benchmark: quickstart-shaped episodes through the real gateway, with a new
container per episode (the limit) and with reused, reset sandboxes (`--reuse-pool`), in one run.

An episode opens a session (0.5 CPU, 256 MB, like the quickstart's), runs `--steps` Python tool
calls and closes it; `--concurrency` episodes run at once (the quickstart's sandbox pool: 32).
The two modes alternate (new, reused, new, reused, ...) so drift on a shared machine hits both.
The last line is the figure object: episodes_per_s_new, episodes_per_s_reused, reuse_speedup
(reused / new), reused_fraction (episodes that got a reset sandbox) and leaked_containers.

    .venv/bin/python bench/sandbox_reuse.py --json [--episodes 160] [--concurrency 32] [--rounds 2]
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
from stacx.sandbox.backends.docker import LABEL_OWNER  # noqa: E402
from stacx.sandbox.client import SandboxClient  # noqa: E402
from stacx.sandbox.sessions import SessionManager  # noqa: E402
from stacx.sandbox.testing import serve_gateway  # noqa: E402

TOOL_CALL = "python3 -c 'print(sum(i * i for i in range(1000)))'"
TARGET_SPEEDUP = 1.3


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=160, help="episodes per round and mode")
    parser.add_argument("--concurrency", type=int, default=32, help="episodes at once")
    parser.add_argument("--steps", type=int, default=2, help="tool calls per episode")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per mode")
    parser.add_argument("--image", default="stacx/sandbox:bookworm")
    parser.add_argument("--json", action="store_true", help="print only JSON lines")
    return parser.parse_args()


async def _episodes(client: SandboxClient, args: argparse.Namespace) -> float:
    """Run `args.episodes` episodes, `args.concurrency` at once; episodes per second."""
    gate = asyncio.Semaphore(args.concurrency)

    async def one() -> None:
        async with gate:
            async with client.session(cpus=0.5, memory_mb=256, lifetime_s=600.0) as info:
                for _ in range(args.steps):
                    result = await client.exec(info.id, TOOL_CALL, timeout_s=60)
                    if result.stdout != "332833500\n":
                        raise RuntimeError(f"tool call failed: {result}")

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(args.episodes)))
    return args.episodes / (time.monotonic() - started)


async def _round(args: argparse.Namespace, reuse: int, owner: str) -> dict[str, Any]:
    config = SessionManager.Config(owner=owner, default_image=args.image, reuse_pool_size=reuse)
    with serve_gateway(DockerBackend(), token="bench", config=config) as url:
        client_config = SandboxClient.Config(base_url=url, token="bench", timeout_s=600)
        async with SandboxClient(client_config) as client:
            rate = await _episodes(client, args)
            reused = _counter(await client.metrics(), "stacx_sandbox_sessions_reused_total")
    return {"reuse_pool": reuse, "episodes_per_s": round(rate, 2), "reused_fraction": reused / args.episodes}


def _counter(metrics: str, name: str) -> float:
    """A counter's value in Prometheus text (0 when the gateway has not counted it yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = (s for family in text_string_to_metric_families(metrics) for s in family.samples)
    return next((s.value for s in samples if s.name == name), 0.0)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    import docker

    owner = f"bench-reuse-{uuid.uuid4().hex[:8]}"
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for reuse in (0, args.concurrency):
            rounds.append(await _round(args, reuse, owner))
            if not args.json:
                print(json.dumps(rounds[-1]), file=sys.stderr)
    leaked = len(docker.from_env().containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"}))
    new = statistics.mean(r["episodes_per_s"] for r in rounds if r["reuse_pool"] == 0)
    reused = statistics.mean(r["episodes_per_s"] for r in rounds if r["reuse_pool"] > 0)
    figures: dict[str, Any] = {
        "episodes_per_s_new": round(new, 2),
        "episodes_per_s_reused": round(reused, 2),
        "reuse_speedup": round(reused / new, 3),
        "reused_fraction": min(r["reused_fraction"] for r in rounds if r["reuse_pool"] > 0),
        "leaked_containers": leaked,
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "steps": args.steps,
        "rounds": rounds,
        "targets": {"reuse_speedup": f">= {TARGET_SPEEDUP}", "leaked_containers": "== 0"},
    }
    figures["pass"] = figures["reuse_speedup"] >= TARGET_SPEEDUP and leaked == 0
    return figures


def main() -> None:
    print(json.dumps(asyncio.run(_run(_parse()))))


if __name__ == "__main__":
    main()
