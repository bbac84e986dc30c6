"""Benchmark: built-in server vs transformers `generate`, and weight swap vs direct load.

    .venv/bin/python bench/inference.py --json

In one run, on one tiny model made locally (`stacx.rollout.models.make_tiny_model`):
* generated tokens/s at batch 1, 8 and 32: concurrent `/generate` requests through
  `InferenceClient` vs one batched `model.generate` call (greedy, fixed length);
  `throughput_ratio` = server / direct at batch 32 (target >= 0.8);
* weight swap latency: `POST /update_weights_from_disk` until it answers (the new version is
  live) vs `safetensors.torch.load_file` + `model.load_state_dict` on the same files in-process;
  `swap_ratio` = server / direct (target <= 1.5);
* GRPO prefix sharing: 8 samples of each of 16 prompts of 512 tokens (all 128 requests at once,
  sampled, as a GRPO rollout sends them) on a server with the prefix cache and on one without;
  `grpo_prefix_cache_speedup` = wall time without / with, plus the cache hit rate;
* `engines`: every installed engine (builtin; vllm once its venv is built) served as `stacx run`
  serves it (`stacx serve --engine NAME`, bench/_engines.py) on the same model and prompts: decode
  tokens/s at batch 1, 8, 32, seconds for the GRPO shape (no per-request seeds), median reload
  seconds (and per GB of safetensors), resident memory of the server's processes, start-up seconds.
  `--only-engines` measures just these.
The last line printed is the JSON figure object; the exit status is 1 when a target is missed
(`meets_targets`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH_SIZES = (1, 8, 32)
THROUGHPUT_TARGET = 0.8
SWAP_TARGET = 1.5


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON figures")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--intermediate-size", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="best of N timed runs")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both sides)")
    parser.add_argument("--grpo-prompts", type=int, default=16)
    parser.add_argument("--grpo-samples", type=int, default=8)
    parser.add_argument("--grpo-prompt-tokens", type=int, default=512)
    parser.add_argument("--grpo-new-tokens", type=int, default=16)
    parser.add_argument("--engines", default="installed", help="comma list (builtin,vllm) or `installed`")
    parser.add_argument("--only-engines", action="store_true", help="measure only the per-engine figures")
    return parser.parse_args()


def _engines(dirs: list[Path], args: argparse.Namespace) -> dict[str, Any]:
    from bench._engines import engine_figures, installed_engines

    names = installed_engines() if args.engines == "installed" else args.engines.split(",")
    return {name: engine_figures(name, dirs, _prompts, args) for name in names}


def _prompts(batch: int, length: int) -> list[list[int]]:
    return [[(32 + (row * 7 + i * 3) % 90) for i in range(length)] for row in range(batch)]


def _direct_once(model: Any, batch: int, args: argparse.Namespace) -> float:
    import torch

    ids = torch.tensor(_prompts(batch, args.prompt_tokens))
    start = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=False,
    )
    assert out.shape[1] == ids.shape[1] + args.new_tokens
    return batch * args.new_tokens / (time.perf_counter() - start)


async def _server_once(client: Any, batch: int, args: argparse.Namespace) -> float:
    from stacx.rollout.inference import SamplingParams

    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    results = await asyncio.gather(*[client.generate(p, params) for p in _prompts(batch, args.prompt_tokens)])
    tokens = sum(len(r.output_ids) for r in results)
    assert tokens == batch * args.new_tokens
    return tokens / (time.perf_counter() - start)


def _throughput(
    model: Any, client: Any, loop: asyncio.AbstractEventLoop, args: argparse.Namespace
) -> tuple[dict[int, float], dict[int, float]]:
    """Best of `repeats` runs per side, the two sides interleaved so load drifts hit both."""
    served: dict[int, float] = {}
    direct: dict[int, float] = {}
    for batch in BATCH_SIZES:
        _direct_once(model, batch, args)  # warm-up
        loop.run_until_complete(_server_once(client, batch, args))
        runs = [
            (_direct_once(model, batch, args), loop.run_until_complete(_server_once(client, batch, args)))
            for _ in range(args.repeats)
        ]
        direct[batch] = max(d for d, _ in runs)
        served[batch] = max(s for _, s in runs)
    return served, direct


def _swap_latencies(
    model: Any, client: Any, loop: asyncio.AbstractEventLoop, dirs: list[Path], repeats: int
) -> tuple[float, float]:
    """Median (server, direct) seconds to put a checkpoint in place, interleaved."""
    from safetensors.torch import load_file

    server_s, direct_s = [], []
    for i in range(repeats * 2):
        path = dirs[(i + 1) % 2]
        start = time.perf_counter()
        model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
        direct_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        answer = loop.run_until_complete(client.update_weights_from_disk(str(path), i + 1))
        server_s.append(time.perf_counter() - start)
        assert answer["success"], answer
    info = loop.run_until_complete(client.get_model_info())
    assert info.weight_version == str(repeats * 2)
    return statistics.median(server_s), statistics.median(direct_s)


async def _grpo_once(client: Any, args: argparse.Namespace) -> float:
    """Seconds to serve every sample of every prompt, all requests sent at once."""
    from stacx.rollout.inference import SamplingParams

    params = SamplingParams(max_new_tokens=args.grpo_new_tokens, temperature=1.0, ignore_eos=True)
    prompts = _prompts(args.grpo_prompts, args.grpo_prompt_tokens)
    start = time.perf_counter()
    results = await asyncio.gather(
        *[client.generate(p, params) for p in prompts for _ in range(args.grpo_samples)]
    )
    assert sum(len(r.output_ids) for r in results) == len(results) * args.grpo_new_tokens
    return time.perf_counter() - start


def _grpo(model_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """The GRPO case on a server with the prefix cache and on one without."""
    from stacx.rollout.inference import BatchingEngine, InferenceClient, InferenceServer

    seconds: dict[str, float] = {}
    hit_rate = 0.0
    for name, cache_tokens in (("with_cache", 1 << 20), ("without_cache", 0)):
        config = InferenceServer.Config(
            model_path=str(model_dir),
            port=0,
            device="cpu",
            engine=BatchingEngine.Config(max_batch_size=128, prefix_cache_tokens=cache_tokens),
        )
        with InferenceServer(config) as server:
            loop = asyncio.new_event_loop()
            client = InferenceClient(InferenceClient.Config(base_url=server.base_url))
            try:
                seconds[name] = loop.run_until_complete(_grpo_once(client, args))
            finally:
                loop.run_until_complete(client.close())
                loop.close()
            if cache_tokens:
                hit_rate = server.engine.metrics.gauges["prefix_cache_hit_rate"]
    return {**seconds, "hit_rate": hit_rate, "speedup": seconds["without_cache"] / seconds["with_cache"]}


def main() -> int:
    args = _parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from stacx.rollout.inference import BatchingEngine, InferenceClient, InferenceServer, load_model
    from stacx.rollout.models import make_tiny_model

    shape = {
        "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    }
    with tempfile.TemporaryDirectory(prefix="stacx-bench-") as tmp:
        dirs = [make_tiny_model(Path(tmp) / f"seed{s}", seed=s, **shape) for s in (0, 1)]
        engines = _engines(dirs, args)
        if args.only_engines:
            print(json.dumps({"benchmark": "inference", "model": shape, "engines": engines}))
            return 0
        model, _ = load_model(dirs[0], device="cpu")
        server = InferenceServer(
            InferenceServer.Config(
                model_path=str(dirs[0]), port=0, device="cpu", engine=BatchingEngine.Config(max_batch_size=64)
            )
        )
        server.start()
        loop = asyncio.new_event_loop()
        client = InferenceClient(InferenceClient.Config(base_url=server.base_url))
        try:
            served, direct = _throughput(model, client, loop, args)
            server_swap, direct_swap = _swap_latencies(model, client, loop, dirs, args.repeats)
        finally:
            loop.run_until_complete(client.close())
            loop.close()
            server.stop()
        size_mb = (dirs[0] / "model.safetensors").stat().st_size / 1e6
        grpo = _grpo(dirs[0], args)
    figures = {
        "benchmark": "inference",
        "model": {
            **shape,
            "parameters": sum(p.numel() for p in model.parameters()),
            "safetensors_mb": round(size_mb, 1),
        },
        "new_tokens": args.new_tokens,
        "prompt_tokens": args.prompt_tokens,
        "torch_threads": args.threads,
        "server_tokens_per_s": {str(b): round(v, 1) for b, v in served.items()},
        "direct_generate_tokens_per_s": {str(b): round(v, 1) for b, v in direct.items()},
        "throughput_ratio": round(served[32] / direct[32], 3),
        "throughput_target": THROUGHPUT_TARGET,
        "swap_latency_s": {"server": round(server_swap, 4), "direct": round(direct_swap, 4)},
        "swap_ratio": round(server_swap / direct_swap, 3),
        "swap_target": SWAP_TARGET,
        "grpo": {
            "prompts": args.grpo_prompts,
            "samples": args.grpo_samples,
            "prompt_tokens": args.grpo_prompt_tokens,
            "new_tokens": args.grpo_new_tokens,
            "seconds_with_cache": round(grpo["with_cache"], 3),
            "seconds_without_cache": round(grpo["without_cache"], 3),
            "prefix_cache_hit_rate": round(grpo["hit_rate"], 3),
        },
        "grpo_prefix_cache_speedup": round(grpo["speedup"], 2),
        "engines": engines,
    }
    figures["meets_targets"] = (
        figures["throughput_ratio"] >= THROUGHPUT_TARGET and figures["swap_ratio"] <= SWAP_TARGET
    )
    if not args.json:
        for batch in BATCH_SIZES:
            print(
                f"batch {batch:>2}: server {served[batch]:8.1f} tok/s   generate {direct[batch]:8.1f} tok/s"
            )
        print(f"swap: server {server_swap * 1000:.1f} ms   direct {direct_swap * 1000:.1f} ms")
        print(
            f"grpo: {grpo['with_cache']:.2f} s with the prefix cache, {grpo['without_cache']:.2f} s without "
            f"(hit rate {grpo['hit_rate']:.2f})"
        )
    print(json.dumps(figures))
    return 0 if figures["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
