"""Fakes for tests, examples and benchmarks: tiny-model configs and synthetic TrainingBatches.

Nothing here downloads anything: models are randomly initialised from small transformers configs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from schemas.records import TrainingBatch, logprobs, loss_mask, token_ids
from trainer.config import CheckpointConfig, ExportConfig, SourceConfig, TrainerConfig
from trainer.models import ModelConfig

__all__ = ["run_jobs", "run_steps", "synthetic_batch", "synthetic_batches", "tiny_trainer_config"]


def synthetic_batch(index: int, *, num_groups: int = 2, group_size: int = 2, prompt_length: int = 4,
                    response_length: int = 6, vocab_size: int = 64, seed: int = 0,
                    ragged: bool = True) -> TrainingBatch:
    """One packed batch: `num_groups` prompts x `group_size` samples, rewards in [0, 1].

    With `ragged`, response lengths vary per sequence (padding is exercised). Logprobs are 0
    (no recorded sampling logprobs: on-policy updates).
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
    rewards = rng.random(len(traj)).astype(np.float32)
    batch_id = hashlib.sha256("|".join(traj).encode() + str(seed).encode()).hexdigest()[:24]
    n = len(traj)
    return TrainingBatch(
        batch_id=batch_id, model_name="tiny", trajectory_ids=traj, group_ids=groups,
        task_types=["synthetic"] * n, policy_versions=np.zeros(n, dtype=np.int32),
        offsets=np.asarray(offsets, dtype=np.int32), lengths=np.asarray(lengths, dtype=np.int32),
        prompt_lengths=np.asarray(prompts, dtype=np.int32), token_ids=token_ids(flat),
        loss_mask=loss_mask(np.concatenate(masks)), logprobs=logprobs(np.zeros(len(flat))),
        rewards=rewards,
    )


def synthetic_batches(count: int, **kwargs: Any) -> list[TrainingBatch]:
    """`count` distinct synthetic batches (see `synthetic_batch`)."""
    return [synthetic_batch(i, **kwargs) for i in range(count)]


def tiny_trainer_config(recipe: str, workdir: Path | str | None = None, *,
                        lr: float = 1e-3, **overrides: Any) -> TrainerConfig:
    """A TrainerConfig on tiny Qwen2 models (teacher: another seed), memory source, no publisher."""
    tiny = ModelConfig(tiny={}, seed=0, attn_implementation="eager")
    models = {"policy": tiny, "teacher": ModelConfig(tiny={}, seed=7, attn_implementation="eager")}
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

    from trainer.engine import StacxTrainer
    from trainer.publish import InMemoryWeightPublisher
    from trainer.sources import InMemoryBatchSource

    trainer = StacxTrainer(config, source=InMemoryBatchSource(batches),
                           publisher=InMemoryWeightPublisher())
    try:
        results = trainer.run(steps)
        if trainer.backend.rank == 0:
            Path(out_path).write_text(json.dumps([r.loss for r in results]))
    finally:
        trainer.close()


def run_jobs(jobs: list[tuple[TrainerConfig, list[TrainingBatch], int, str]]) -> None:
    """`run_steps` for each job in one process group (pays process start-up once)."""
    import os

    import torch.distributed as dist

    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    try:
        for config, batches, steps, out_path in jobs:
            run_steps(config, batches, steps, out_path)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
