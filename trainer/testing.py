"""Fakes for tests, examples and benchmarks: tiny-model configs and synthetic TrainingBatches.

Nothing here downloads anything: models are randomly initialised from small transformers configs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from stacx.schemas.records import TrainingBatch, logprobs, loss_mask, token_ids
from stacx.trainer.config import CheckpointConfig, ExportConfig, SourceConfig, TrainerConfig
from stacx.trainer.models import ModelConfig

__all__ = ["run_gradients", "run_jobs", "run_steps", "synthetic_batch", "synthetic_batches",
           "tiny_trainer_config"]


def synthetic_batch(index: int, *, num_groups: int = 2, group_size: int = 2, prompt_length: int = 4,
                    response_length: int = 6, vocab_size: int = 64, seed: int = 0,
                    ragged: bool = True, recorded_logprobs: bool = False,
                    temperature: float = 1.0, greedy_first: bool = False,
                    teacher_logprobs: bool = False) -> TrainingBatch:
    """One packed batch: `num_groups` prompts x `group_size` samples, rewards in [0, 1].

    With `ragged`, response lengths vary per sequence (padding is exercised). Without
    `recorded_logprobs` no sampling logprobs are recorded (on-policy updates); with it, random
    ones in [-4, -0.05] stand for a behaviour policy other than the trainer's. With
    `greedy_first`, the first sample of each group is greedy (temperature 0: ReMax's baseline).
    With `teacher_logprobs`, a served teacher's logprobs in [-4, -0.05] on the response tokens.
    """
    rng = np.random.default_rng(seed * 100_003 + index)
    ids, masks, offsets, lengths, prompts, groups, traj = [], [], [], [], [], [], []
    offset = 0
    for g in range(num_groups):
        prompt = rng.integers(1, vocab_size, prompt_length)
        for s in range(group_size):
            resp_len = response_length - (int(rng.integers(0, 3)) if ragged else 0)
            response = rng.integers(1, vocab_size, resp_len)
            ids.append(np.concatenate([prompt, response]))
            masks.append(np.concatenate([np.zeros(prompt_length), np.ones(resp_len)]))
            offsets.append(offset)
            lengths.append(prompt_length + resp_len)
            prompts.append(prompt_length)
            offset += prompt_length + resp_len
            groups.append(f"b{index}-g{g}")
            traj.append(f"b{index}-g{g}-s{s}")
    flat = np.concatenate(ids)
    flat_mask = np.concatenate(masks)
    sampled = rng.uniform(-4.0, -0.05, len(flat)) * flat_mask if recorded_logprobs \
        else np.zeros(len(flat))
    rewards = rng.random(len(traj)).astype(np.float32)
    batch_id = hashlib.sha256("|".join(traj).encode() + str(seed).encode()).hexdigest()[:24]
    n = len(traj)
    temperatures = np.full(n, temperature, dtype=np.float32)
    if greedy_first:
        temperatures[::group_size] = 0.0
    return TrainingBatch(
        batch_id=batch_id, model_name="tiny", trajectory_ids=traj, group_ids=groups,
        task_types=["synthetic"] * n, policy_versions=np.zeros(n, dtype=np.int32),
        offsets=np.asarray(offsets, dtype=np.int32), lengths=np.asarray(lengths, dtype=np.int32),
        prompt_lengths=np.asarray(prompts, dtype=np.int32), token_ids=token_ids(flat),
        loss_mask=loss_mask(flat_mask), logprobs=logprobs(sampled), rewards=rewards,
        temperatures=temperatures,
        logprobs_recorded=np.full(n, int(recorded_logprobs), dtype=np.uint8),
        teacher_logprobs=logprobs(rng.uniform(-4.0, -0.05, len(flat)) * flat_mask)
        if teacher_logprobs else None,
    )


def synthetic_batches(count: int, **kwargs: Any) -> list[TrainingBatch]:
    """`count` distinct synthetic batches (see `synthetic_batch`)."""
    return [synthetic_batch(i, **kwargs) for i in range(count)]


def tiny_trainer_config(recipe: str, workdir: Path | str | None = None, *,
                        lr: float = 1e-3, **overrides: Any) -> TrainerConfig:
    """A TrainerConfig on tiny Qwen2 models (teacher, reward: other seeds), memory source, no
    publisher."""
    tiny = ModelConfig(tiny={}, seed=0, attn_implementation="eager")
    models = {"policy": tiny, "teacher": ModelConfig(tiny={}, seed=7, attn_implementation="eager"),
              "reward": ModelConfig(tiny={}, seed=3, attn_implementation="eager")}
    root = Path(workdir) if workdir is not None else None
    fields: dict[str, Any] = {
        "recipe": recipe, "models": models,
        "source": SourceConfig(kind="memory"),
        "checkpoint": CheckpointConfig(dir=str(root / "ckpt") if root else None),
        "export": ExportConfig(dir=str(root / "export") if root else None, publish=False),
    }
    fields.update(overrides)
    config = TrainerConfig(**fields)
    config.optimizer.lr = lr
    config.optimizer.max_grad_norm = None
    return config


def run_steps(config: TrainerConfig, batches: list[TrainingBatch], steps: int,
              out_path: str) -> None:
    """Train `steps` steps from memory and write rank 0's losses as JSON (a spawn target)."""
    import json

    from stacx.trainer.engine import StacxTrainer
    from stacx.trainer.publish import InMemoryWeightPublisher
    from stacx.trainer.sources import InMemoryBatchSource

    trainer = StacxTrainer(config, source=InMemoryBatchSource(batches),
                           publisher=InMemoryWeightPublisher())
    try:
        results = trainer.run(steps)
        if trainer.backend.rank == 0:
            Path(out_path).write_text(json.dumps([r.loss for r in results]))
    finally:
        trainer.close()


def run_gradients(config: TrainerConfig, batch: TrainingBatch, out_path: str) -> None:
    """One forward/backward (no optimizer step) and write rank 0's loss and the full gradient of
    every trainable parameter (`torch.save`): {"loss": float, "grads": {slot.param: tensor}}."""
    import torch

    from stacx.trainer.engine import StacxTrainer
    from stacx.trainer.publish import InMemoryWeightPublisher
    from stacx.trainer.sources import InMemoryBatchSource

    trainer = StacxTrainer(config, source=InMemoryBatchSource([]),
                           publisher=InMemoryWeightPublisher())
    try:
        loss, metrics = trainer.forward_backward(batch)
        grads = {}
        for name, worker in trainer.models.items():
            if worker.module is None or not worker.trainable:
                continue
            for pname, param in worker.module.named_parameters():
                if param.grad is not None:
                    grad = param.grad
                    full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
                    grads[f"{name}.{pname}"] = full.detach().cpu().clone()
        if trainer.backend.rank == 0:
            torch.save({"loss": loss, "metrics": metrics, "grads": grads}, out_path)
    finally:
        trainer.close()


Job = tuple[TrainerConfig, list[TrainingBatch], int, str]


def run_jobs(jobs: list[Job]) -> None:
    """`run_steps` for each job in one process group (pays process start-up once); a job with
    0 steps runs `run_gradients` on its first batch instead."""
    import os

    import torch.distributed as dist

    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    try:
        for config, batches, steps, out_path in jobs:
            if steps == 0:
                run_gradients(config, batches[0], out_path)
            else:
                run_steps(config, batches, steps, out_path)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
