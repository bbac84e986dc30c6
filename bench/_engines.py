"""Per-engine figures for bench/inference.py: every installed engine served as `stacx run` serves
it (`stacx serve --engine NAME`), driven through the same client on the same prompts."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

DECODE_BATCHES = (1, 8, 32)


def installed_engines() -> list[str]:
    """builtin always; vllm once its venv is built (`python -m stacx.infra.engine_venv`)."""
    from stacx.infra.engine_venv import vllm_cpu_python

    return ["builtin", *(["vllm"] if vllm_cpu_python().exists() else [])]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(engine: str, model: Path, threads: int) -> tuple[subprocess.Popen[bytes], str, float]:
    port = _port()
    cmd = [sys.executable, "-m", "stacx.infra.cli", "serve", "--engine", engine, "--model", str(model),
           "--port", str(port), "--weight-version", "0", "--threads", str(threads), "--max-batch-size", "128"]
    started = time.perf_counter()
    quiet = subprocess.DEVNULL
    process = subprocess.Popen(cmd, stdout=quiet, stderr=quiet, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"stacx serve --engine {engine} exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return process, url, time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.25)


def _stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _rss_gib(process: subprocess.Popen[bytes]) -> float:
    """Resident memory of the server and every process it started (vLLM: engine core, worker)."""
    root = psutil.Process(process.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**30


def _best(url: str, prompts: list[list[int]], repeat: int, runs: int, **params: Any) -> float:
    """Fewest seconds of `runs` timed runs, after one warm-up run."""
    asyncio.run(_timed(url, prompts, repeat, **params))
    return min(asyncio.run(_timed(url, prompts, repeat, **params)) for _ in range(runs))


async def _timed(url: str, prompts: list[list[int]], repeat: int, **params: Any) -> float:
    from stacx.rollout.inference import InferenceClient, SamplingParams

    sampling = SamplingParams(**params)
    async with InferenceClient(InferenceClient.Config(base_url=url)) as client:
        start = time.perf_counter()
        calls = [client.generate(p, sampling) for p in prompts for _ in range(repeat)]
        results = await asyncio.gather(*calls)
        assert all(len(r.output_ids) == params["max_new_tokens"] for r in results)
        return time.perf_counter() - start


async def _reload(url: str, dirs: list[Path], swaps: int) -> float:
    from stacx.rollout.inference import InferenceClient

    seconds = []
    async with InferenceClient(InferenceClient.Config(base_url=url)) as client:
        for i in range(swaps):
            start = time.perf_counter()
            answer = await client.update_weights_from_disk(str(dirs[(i + 1) % 2]), weight_version=i + 1)
            seconds.append(time.perf_counter() - start)
            assert answer.get("success", True), answer
        assert (await client.get_model_info()).weight_version == str(swaps)
    return statistics.median(seconds)


def engine_figures(engine: str, dirs: list[Path], prompts: Callable[[int, int], list[list[int]]],
                   args: Any) -> dict[str, Any]:
    """Decode tokens/s per batch, the GRPO shape's seconds, reload s and s/GB, memory, start-up."""
    process, url, startup_s = _start(engine, dirs[0], args.threads)
    try:
        decode = {}
        for batch in DECODE_BATCHES:
            best = _best(url, prompts(batch, args.prompt_tokens), 1, args.repeats,
                         max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
            decode[str(batch)] = round(batch * args.new_tokens / best, 1)
        grpo_prompts = prompts(args.grpo_prompts, args.grpo_prompt_tokens)
        grpo = _best(url, grpo_prompts, args.grpo_samples, args.repeats,
                     max_new_tokens=args.grpo_new_tokens, temperature=1.0, ignore_eos=True)
        rss = _rss_gib(process)
        reload_s = asyncio.run(_reload(url, dirs, 2 * args.repeats))
    finally:
        _stop(process)
    size_gb = (dirs[0] / "model.safetensors").stat().st_size / 1e9
    return {"decode_tokens_per_s": decode, "grpo_seconds": round(grpo, 3), "reload_s": round(reload_s, 4),
            "reload_s_per_gb": round(reload_s / size_gb, 3), "rss_gib": round(rss, 2),
            "startup_s": round(startup_s, 1)}
