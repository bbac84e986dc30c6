"""Benchmark on a CUDA GPU: SGLang vs the built-in server, weight sync, the FSDP2 trainer.

    .venv/bin/python bench/gpu.py --json          (tests/gpu/run_on_device.sh runs it)

In one run, on models made locally (`stacx.rollout.models.make_tiny_model`, nothing downloaded):
* serving: the same prompts (`--prompts` requests of `--prompt-tokens` ids, `--new-tokens`
  each, all sent at once, greedy, `ignore_eos`) to SGLang through the rollout's path
  (`InferenceClient` behind `stacx route`'s router app) and through a bench_serving-style
  client (raw concurrent `POST /generate`, the way SGLang's `bench_serving` drives a server),
  and to the built-in server on the same GPU. `sglang_vs_peer` = ours / peer (target >= 0.9);
* weight sync: `WeightSubscriber.apply` (`/update_weights_from_disk`, confirmed on
  `/get_model_info`) of a ~`--sync-gb` GB checkpoint; `sync_s_per_gb` (target <= 2.0);
* trainer: GRPO steps of the FSDP2 backend (NCCL, bf16) on synthetic batches: tokens/s and MFU
  against `--peak-tflops` (H200 bf16 dense: 989).
Every figure needs a CUDA GPU and the sglang package: without them it exits 2 with one line
saying which is missing (never a silent skip). The last line printed is the JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEER_TARGET = 0.9
SYNC_TARGET_S_PER_GB = 2.0
SERVE_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2}
"""head_dim 64: a shape every SGLang attention backend runs."""


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON figures")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--sync-gb", type=float, default=1.0, help="size of the weight-sync checkpoint")
    parser.add_argument("--trainer-steps", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--mem-fraction", type=float, default=0.3)
    return parser.parse_args()


def _missing() -> str | None:
    from stacx.rollout.inference.sglang import unavailable_reason

    return unavailable_reason()


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prompts(args: argparse.Namespace) -> list[list[int]]:
    return [[(7 * i + j) % 200 + 10 for j in range(args.prompt_tokens)] for i in range(args.prompts)]


async def _ours(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    """Generated tokens/s through the rollout's client."""
    from stacx.rollout.inference import InferenceClient, SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    async with InferenceClient(InferenceClient.Config(base_url=url)) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(client.generate(p, params) for p in prompts))
        wall = time.perf_counter() - t0
    return sum(len(r.output_ids) for r in results) / wall


async def _peer(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    """Generated tokens/s of a bench_serving-style client: raw concurrent POSTs, no retries."""
    import httpx

    params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
    limits = httpx.Limits(max_connections=len(prompts))
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        t0 = time.perf_counter()
        answers = await asyncio.gather(
            *(http.post("/generate", json={"input_ids": p, "sampling_params": params}) for p in prompts))
        wall = time.perf_counter() - t0
    return sum(len(a.json()["output_ids"]) for a in answers) / wall


def _serving(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    from stacx.rollout.inference.sglang import SGLangServer

    prompts = _prompts(args)
    server = SGLangServer(SGLangServer.Config(model_path=str(model), port=_port(), dtype="bfloat16",
                                              weight_version="0", mem_fraction_static=args.mem_fraction,
                                              extra_args=["--log-level", "warning"]))
    server.start()
    try:
        server.wait_ready(timeout_s=600)
        asyncio.run(_peer(server.base_url, prompts[:8], 8))  # warm-up (CUDA graphs, allocator)
        peer = asyncio.run(_peer(server.base_url, prompts, args.new_tokens))
        routed = _through_router(server.base_url, prompts, args.new_tokens)
        direct = asyncio.run(_ours(server.base_url, prompts, args.new_tokens))
    finally:
        server.stop()
    builtin = _builtin(model, prompts, args.new_tokens)
    return {"sglang_peer_tokens_per_s": round(peer, 1), "sglang_ours_tokens_per_s": round(direct, 1),
            "sglang_routed_tokens_per_s": round(routed, 1), "builtin_tokens_per_s": round(builtin, 1),
            "sglang_vs_peer": round(direct / peer, 3), "sglang_routed_vs_peer": round(routed / peer, 3),
            "sglang_vs_builtin": round(direct / builtin, 2)}


def _through_router(upstream: str, prompts: list[list[int]], new_tokens: int) -> float:
    """The same prompts through sglang-router (`stacx route`'s command line, one upstream)."""
    import subprocess

    from stacx.rollout.inference.router import RouterConfig, router_command

    port = _port()
    router = subprocess.Popen(router_command(RouterConfig(port=port, upstreams=[upstream])))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _answers(f"{url}/readiness"):
            assert router.poll() is None and time.monotonic() < deadline, "sglang-router did not start"
            time.sleep(0.2)
        return asyncio.run(_ours(url, prompts, new_tokens))
    finally:
        router.terminate()
        router.wait(30)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _builtin(model: Path, prompts: list[list[int]], new_tokens: int) -> float:
    from stacx.rollout.inference import InferenceServer

    server = InferenceServer(InferenceServer.Config(model_path=str(model), port=0, device="cuda",
                                                    dtype="bfloat16"))
    server.start(timeout_s=300)
    try:
        asyncio.run(_ours(server.base_url, prompts[:8], 8))
        return asyncio.run(_ours(server.base_url, prompts, new_tokens))
    finally:
        server.stop()


def _weight_sync(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`update_weights_from_disk` of a checkpoint of about `--sync-gb` GB (bf16), confirmed."""
    from stacx.consumers.weights import WeightSubscriber
    from stacx.rollout.inference.sglang import SGLangServer
    from stacx.rollout.models import make_tiny_model
    from stacx.schemas.records import WeightVersion

    layers = 8
    hidden = 2048
    # parameters per layer ~ 12 h^2 (attention 4 h^2 with full kv heads, MLP 8 h^2 at 4h... here 3 x h x 2h)
    shape = {"hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers,
             "num_attention_heads": 32, "num_key_value_heads": 32}
    scale = max(1, round(args.sync_gb * 1e9 / (2 * layers * 16 * hidden * hidden)))
    shape["num_hidden_layers"] = layers * scale
    first = make_tiny_model(root / "sync-v0", seed=0, **shape)
    second = make_tiny_model(root / "sync-v1", seed=1, **shape)
    size_gb = sum(p.stat().st_size for p in second.glob("*.safetensors")) / 1e9
    server = SGLangServer(SGLangServer.Config(model_path=str(first), port=_port(), dtype="bfloat16",
                                              weight_version="0", mem_fraction_static=args.mem_fraction,
                                              extra_args=["--log-level", "warning", "--disable-cuda-graph"]))
    server.start()
    try:
        server.wait_ready(timeout_s=900)
        config = WeightSubscriber.Config(model_name="policy", server_url=server.base_url)
        subscriber = WeightSubscriber(config, source=_NoEvents())
        t0 = time.perf_counter()
        subscriber.apply(WeightVersion(model_name="policy", version=1, path=str(second)))
        seconds = time.perf_counter() - t0
    finally:
        server.stop()
    return {"sync_gb": round(size_gb, 3), "sync_s": round(seconds, 2),
            "sync_s_per_gb": round(seconds / size_gb, 3),
            "sync_from_tensor": "not measured: needs the trainer and SGLang in one process group"}


class _NoEvents:
    """The subscriber's event source when `apply` is called directly."""

    def poll(self, timeout: float = 1.0) -> None:
        return None

    def total_lag(self, timeout: float = 10.0) -> int:
        return 0

    def assignment(self) -> list[tuple[str, int]]:
        return []

    def commit(self, events: Any = None) -> None:
        pass

    def close(self) -> None:
        pass


def _trainer(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """GRPO steps of FSDP2 on one GPU (NCCL, bf16, activation checkpointing): tokens/s, MFU."""
    from stacx.trainer import BackendConfig
    from stacx.trainer.distributed import spawn
    from stacx.trainer.testing import run_jobs, synthetic_batches, tiny_trainer_config

    batches = synthetic_batches(args.trainer_steps + 1, num_groups=8, group_size=8, prompt_length=128,
                                response_length=384, ragged=False)
    tokens = sum(int(sum(b.lengths)) for b in batches[1:])
    backend = BackendConfig(kind="fsdp2", world_size=1, device="cuda", mixed_precision=True,
                            activation_checkpointing=True)
    out = root / "trainer.json"
    t0 = time.perf_counter()  # start-up and the first step (CUDA context, NCCL, allocator) ...
    first = tiny_trainer_config("grpo", root / "trainer-warm", backend=backend)
    spawn(run_jobs, 1, [(first, batches[:1], 1, str(out))])
    warm = time.perf_counter() - t0
    config = tiny_trainer_config("grpo", root / "trainer", backend=backend)  # ... then all steps, fresh
    t0 = time.perf_counter()
    spawn(run_jobs, 1, [(config, batches, len(batches), str(out))])
    wall = max(1e-9, time.perf_counter() - t0 - warm)
    params = _num_params(config)
    per_s = tokens / wall
    return {"trainer_tokens_per_s": round(per_s, 1), "trainer_params": params,
            "trainer_mfu": round(6 * params * per_s / (args.peak_tflops * 1e12), 5)}


def _num_params(config: Any) -> int:
    from stacx.trainer.models import build_model

    model = build_model(config.models["policy"])
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    args = _parse_args()
    missing = _missing()
    if missing is not None:
        print(f"bench/gpu.py: cannot run here: {missing}", file=sys.stderr)
        return 2
    from stacx.rollout.models import make_tiny_model

    figures: dict[str, Any] = {"bench": "gpu", "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = make_tiny_model(root / "serve", seed=0, **SERVE_SHAPE)
        figures |= _serving(model, args)
        figures |= _weight_sync(root, args)
        figures |= _trainer(root, args)
    figures["e2e_trajectories_per_s"] = ("not measured here: `stacx run examples/gpu.yaml` needs Kafka and "
                                         "Docker beside the GPUs")
    figures["targets"] = {"sglang_vs_peer": PEER_TARGET, "sync_s_per_gb": SYNC_TARGET_S_PER_GB}
    figures["ok"] = (figures["sglang_vs_peer"] >= PEER_TARGET
                     and figures["sync_s_per_gb"] <= SYNC_TARGET_S_PER_GB)
    if not args.json:
        for key, value in figures.items():
            print(f"{key:>28}: {value}")
    print(json.dumps(figures))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
