"""Trainer throughput: a GRPO step with StacxTrainer vs a hand-written PyTorch loop, and FSDP2.

    .venv/bin/python bench/trainer.py --json

Same model (a small random Qwen2), same batches, same loss (GRPO: group-normalised advantages,
PPO clip, k3 KL to a frozen reference, seq-mean-token-mean), same AdamW and grad clipping. Steps
of the two loops are interleaved so machine load hits both alike; the median step time counts.
Figures (last line of output, JSON):
  overhead_ratio = ours / plain tokens/s, median wall time per step (target >= 0.9)
  overhead_ratio_cpu = the same from CPU time (steadier when the machine is shared)
  fsdp_ratio     = FSDP2 on 2 CPU processes (1 thread each) / single process (1 thread)
                   tokens/s on the same global batch
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # `trainer` is the package, not this file

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from stacx.schemas.records import TrainingBatch  # noqa: E402
from stacx.trainer import (  # noqa: E402
    BackendConfig,
    InMemoryBatchSource,
    ModelConfig,
    StacxTrainer,
    TrainerConfig,
    to_tensor_batch,
)
from stacx.trainer.config import CheckpointConfig, ExportConfig, SourceConfig  # noqa: E402
from stacx.trainer.models import build_model  # noqa: E402
from stacx.trainer.testing import synthetic_batches  # noqa: E402

MODEL = {"vocab_size": 2048, "hidden_size": 128, "intermediate_size": 256,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
BATCH = {"num_groups": 4, "group_size": 4, "prompt_length": 32, "response_length": 96,
         "vocab_size": 2048, "ragged": False}
LR, KL_BETA, CLIP, MAX_NORM = 1e-4, 0.04, 0.2, 1.0


def trainer_config(backend: BackendConfig | None = None) -> TrainerConfig:
    config = TrainerConfig(
        recipe="grpo", models={"policy": ModelConfig(tiny=MODEL, seed=0)},
        role_options={"policy": {"kl_beta": KL_BETA, "clip_low": CLIP, "clip_high": CLIP}},
        source=SourceConfig(kind="memory"), checkpoint=CheckpointConfig(dir=None),
        export=ExportConfig(dir=None), backend=backend or BackendConfig())
    config.optimizer.lr, config.optimizer.max_grad_norm = LR, MAX_NORM
    return config


# ------------------------------------------------------------------ the hand-written baseline

def _token_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


class PlainLoop:
    """GRPO written directly against transformers + torch, no framework."""

    def __init__(self) -> None:
        self.policy = build_model(ModelConfig(tiny=MODEL, seed=0)).backbone.train()
        self.ref = build_model(ModelConfig(tiny=MODEL, seed=0)).backbone.eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=LR)

    def step(self, batch: TrainingBatch) -> float:
        t = to_tensor_batch(batch)  # the same padding ours does (counted on both sides)
        ids, attn, mask, targets = t.input_ids, t.attention_mask, t.loss_mask, t.input_ids[:, 1:]
        with torch.no_grad():
            ref_logp = _token_logp(self.ref(input_ids=ids, attention_mask=attn).logits[:, :-1],
                                   targets)
        logp = _token_logp(self.policy(input_ids=ids, attention_mask=attn).logits[:, :-1], targets)
        adv = torch.zeros_like(t.rewards)
        for g in t.group_index.unique():
            r = t.rewards[t.group_index == g]
            adv[t.group_index == g] = (r - r.mean()) / (r.std() + 1e-6)
        ratio = torch.exp(logp - logp.detach())
        a = adv[:, None]
        per_token = -torch.minimum(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP) * a)
        pg = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
        delta = ref_logp - logp  # k3, aggregated like the policy term (seq-mean-token-mean)
        kl = (((torch.exp(delta) - delta - 1) * mask).sum(-1) / mask.sum(-1)).mean()
        loss = pg + KL_BETA * kl
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), MAX_NORM)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.item())


# ------------------------------------------------------------------ measurements

def compare_with_plain(batches: list[TrainingBatch], warmup: int) -> dict[str, list[float]]:
    """Wall and CPU seconds per step of both loops, interleaved (order alternating per step)."""
    ours = StacxTrainer(trainer_config(), source=InMemoryBatchSource([]))
    plain = PlainLoop()
    runners = {"ours": ours.train_step, "plain": plain.step}
    times: dict[str, list[float]] = {f"{n}_{k}": [] for n in runners for k in ("wall", "cpu")}
    for i, batch in enumerate(batches):
        for name in (("ours", "plain") if i % 2 == 0 else ("plain", "ours")):
            wall, cpu = time.perf_counter(), time.process_time()
            runners[name](batch)
            if i >= warmup:
                times[f"{name}_wall"].append(time.perf_counter() - wall)
                times[f"{name}_cpu"].append(time.process_time() - cpu)
    return times


def fsdp_rank(batches: list[TrainingBatch], warmup: int, out_path: str) -> None:
    """Spawn target: FSDP2 steps on 2 ranks, interleaved with single-process steps on rank 0
    (rank 1 waits at a barrier meanwhile), so load swings hit both alike."""
    import torch.distributed as dist

    from stacx.trainer.backends import SingleProcessBackend

    config = trainer_config(BackendConfig(kind="fsdp2", world_size=2, device="cpu"))
    sharded = StacxTrainer(config, source=InMemoryBatchSource([]))
    rank = sharded.backend.rank
    single = StacxTrainer(trainer_config(), source=InMemoryBatchSource([]),
                          backend=SingleProcessBackend(BackendConfig(device="cpu"))) \
        if rank == 0 else None
    times: dict[str, list[float]] = {"fsdp": [], "single": []}
    for i, batch in enumerate(batches):
        dist.barrier()
        if single is not None:
            start = time.perf_counter()
            single.train_step(batch)
            if i >= warmup:
                times["single"].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        sharded.train_step(batch)
        dist.barrier()
        if i >= warmup:
            times["fsdp"].append(time.perf_counter() - start)
    if rank == 0:
        Path(out_path).write_text(json.dumps(times))
    sharded.close()


def fsdp_times(batches: list[TrainingBatch], warmup: int) -> dict[str, list[float]]:
    from stacx.trainer.distributed import spawn

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        spawn(fsdp_rank, 2, batches, warmup, out)
        result: dict[str, list[float]] = json.loads(Path(out).read_text())
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON figures")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per loop")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps per loop")
    parser.add_argument("--no-fsdp", action="store_true", help="skip the FSDP2 comparison")
    args = parser.parse_args()
    batches = synthetic_batches(args.warmup + args.steps, **BATCH)  # type: ignore[arg-type]
    tokens = int(sum(int(b.lengths.sum()) for b in batches) / len(batches))
    torch.set_num_threads(1)  # the machine is shared: one thread per process steadies timings
    times = compare_with_plain(batches, args.warmup)
    median = {k: statistics.median(v) for k, v in times.items()}
    figures: dict[str, Any] = {
        "tokens_per_step": tokens,
        "tokens_per_s_ours": tokens / median["ours_wall"],
        "tokens_per_s_plain": tokens / median["plain_wall"],
        "overhead_ratio_cpu": median["plain_cpu"] / median["ours_cpu"],
    }
    figures["overhead_ratio"] = figures["tokens_per_s_ours"] / figures["tokens_per_s_plain"]
    figures["overhead_target"] = 0.9
    figures["overhead_ok"] = figures["overhead_ratio"] >= 0.9
    if not args.no_fsdp:
        fsdp = fsdp_times(batches, args.warmup)
        figures["tokens_per_s_single"] = tokens / statistics.median(fsdp["single"])
        figures["tokens_per_s_fsdp2_2procs"] = tokens / statistics.median(fsdp["fsdp"])
        figures["fsdp_ratio"] = figures["tokens_per_s_fsdp2_2procs"] / figures["tokens_per_s_single"]
    figures.update({"model": MODEL, "batch": BATCH, "cpu_count": os.cpu_count(),
                    "loadavg_1m": os.getloadavg()[0], "torch_threads": torch.get_num_threads()})
    if not args.json:
        print(f"ours {figures['tokens_per_s_ours']:.0f} tok/s, plain "
              f"{figures['tokens_per_s_plain']:.0f} tok/s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
