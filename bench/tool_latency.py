"""Record the sandbox's exec times on the race task's tool calls (the sample `bench/peer_trl.py
--latency-model recorded` draws tool latency from).

Starts the real gateway over one backend (`process`: bubblewrap; `docker`: one container per
session), opens `--sessions` sessions, and runs the two tool calls of `--problems` training problems
of examples/quickstart/chain.py exactly as the ReTool scaffold does (`python3 -`, the code on
stdin), `--concurrency` execs in flight; each exec's round trip through the gateway is one value.
Writes bench/data/tool_latency_<backend>.json (the sample, in seconds, with how it was recorded) and
prints one JSON line (p50/p90/p99/mean).

    .venv/bin/python bench/tool_latency.py --backend process --json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402

from stacx.sandbox.client import SandboxClient  # noqa: E402
from stacx.sandbox.sessions import SessionManager  # noqa: E402
from stacx.sandbox.testing import serve_gateway  # noqa: E402

CHAIN = _HERE.parent / "examples" / "quickstart" / "chain.py"


def _chain() -> Any:
    sys.path.append(str(CHAIN.parents[1]))
    spec = importlib.util.spec_from_file_location("_latency_chain", CHAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def tool_calls(num_problems: int, seed: int) -> list[str]:
    """The code of both tool calls of each problem, as the demonstrations write them."""
    codes = []
    for p in _chain().make_problems(num_problems, seed=seed):
        codes += [f"print({p.inner})", f"print({p.inner_value}+{p.outer})"]
    return codes


def _backend(name: str) -> Any:
    if name == "process":
        from stacx.sandbox.backends.process import ProcessBackend

        return ProcessBackend()
    from stacx.sandbox.backends import DockerBackend

    return DockerBackend(DockerBackend.Config())


async def record(args: argparse.Namespace) -> list[float]:
    codes = tool_calls(args.problems, args.seed)
    config = SessionManager.Config(owner=f"latency-{uuid.uuid4().hex[:8]}", default_image=args.image)
    with serve_gateway(_backend(args.backend), token="bench", config=config) as url:
        client_config = SandboxClient.Config(base_url=url, token="bench", timeout_s=600)
        async with SandboxClient(client_config) as client:
            ids = [(await client.create_session()).id for _ in range(args.sessions)]
            gate = asyncio.Semaphore(args.concurrency)
            times: list[float] = []

            async def one(i: int, code: str) -> None:
                async with gate:
                    t = time.perf_counter()
                    sid = ids[i % len(ids)]
                    result = await client.exec(sid, "python3 -", stdin=code + "\n", timeout_s=60)
                    times.append(time.perf_counter() - t)
                    if result.exit_code != 0:
                        raise SystemExit(f"tool call {code!r} failed in the sandbox: {result}")

            try:
                await one(0, "print(1)")  # the first exec warms the session up: not a tool call
                times.clear()
                await asyncio.gather(*(one(i, code) for i, code in enumerate(codes)))
            finally:
                await asyncio.gather(*(client.close_session(sid) for sid in ids), return_exceptions=True)
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument("--problems", type=int, default=128, help="two tool calls each")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8, help="execs in flight (a group's episodes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image", default="stacx/sandbox:bookworm")
    parser.add_argument("--out", default="", help="default: bench/data/tool_latency_<backend>.json")
    parser.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    args = parser.parse_args(argv)
    times = asyncio.run(record(args))
    sample = np.asarray(times)
    summary = {
        "benchmark": "tool_latency",
        "backend": args.backend,
        "execs": len(times),
        **{f"p{q}_ms": round(float(np.percentile(sample, q)) * 1000, 1) for q in (50, 90, 99)},
        "mean_ms": round(float(sample.mean()) * 1000, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    out = Path(args.out) if args.out else _HERE / "data" / f"tool_latency_{args.backend}.json"
    record_doc = {
        "what": "round trip of one exec through the STACX sandbox gateway (HTTP, backend, python3 -) "
        "on the race task's tool calls (examples/quickstart/chain.py), in seconds",
        "command": "bench/tool_latency.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "recorded_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "cpu_count": os.cpu_count(),
        **{k: v for k, v in vars(args).items() if k not in ("out", "json")},
        "summary": summary,
        "exec_s": [round(t, 4) for t in times],
    }
    out.write_text(json.dumps(record_doc, indent=1) + "\n")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
