"""Sampling temperature: a frozen policy sampled at T = 0.7 is exactly on-policy for the trainer.

The rollout side is real: tokens and logprobs come from the inference server's sampler
(`stacx.rollout.inference.sampling.sample_tokens`) on the trainer's own policy weights, trajectories are
packed by the assembler's `pack_batch`, and the trainer scores each row at its temperature.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from stacx.consumers.assembly import PackedGroup, pack_batch
from stacx.rollout.inference.sampling import RowSampling, SamplingParams, sample_tokens
from stacx.schemas.records import TrainingBatch, Trajectory, logprobs, loss_mask, token_ids
from stacx.trainer import InMemoryBatchSource, ModelConfig, StacxTrainer, to_tensor_batch
from stacx.trainer.protocols import ModelOutput
from stacx.trainer.specialization import TokenLogprobs
from stacx.trainer.testing import tiny_trainer_config

TEMPERATURE = 0.7


@torch.no_grad()
def _sample(model: torch.nn.Module, prompt: list[int], num_new: int,
            generator: torch.Generator) -> tuple[list[int], list[float]]:
    ids, lps = list(prompt), [0.0] * len(prompt)
    params = [SamplingParams(temperature=TEMPERATURE, max_new_tokens=num_new)]
    for _ in range(num_new):
        logits = model(input_ids=torch.tensor([ids])).logits[:, -1]  # [1, V]
        rows = RowSampling.build(params, [ids[len(prompt):]], [frozenset()], [None], logits.shape[-1],
                                 torch.device("cpu"))
        result = sample_tokens(logits, rows, generator)
        ids.append(int(result.tokens.item()))
        lps.append(float(result.logprobs.item()))
    return ids, lps


def _rollout_batch(model: torch.nn.Module, *, num_groups: int = 2, group_size: int = 3,
                   seed: int = 0) -> TrainingBatch:
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(num_groups):
        prompt = rng.integers(1, 64, int(rng.integers(3, 6))).tolist()
        trajectories = []
        for s in range(group_size):
            ids, lps = _sample(model, prompt, int(rng.integers(3, 8)), generator)
            trajectories.append(Trajectory(
                trajectory_id=f"t{g}-{s}", group_id=f"g{g}", sample_index=s, task_id=f"k{g}",
                task_type="synthetic", model_name="tiny", policy_version=0,
                token_ids=token_ids(ids), loss_mask=loss_mask([0] * len(prompt) + [1] * (
                    len(ids) - len(prompt))),
                logprobs=logprobs(lps), temperature=TEMPERATURE, prompt_length=len(prompt),
                reward=float(rng.random())))
        groups.append(PackedGroup(group_id=f"g{g}", trajectories=trajectories))
    return pack_batch(groups, model_name="tiny")


def _trainer() -> tuple[StacxTrainer, torch.nn.Module]:
    """GRPO on a tiny policy with a peaked next-token distribution (as a trained LM has; the
    default 0.02 initialisation is nearly uniform, where temperature hardly matters)."""
    torch.set_num_threads(1)
    config = tiny_trainer_config("grpo")
    config.models["policy"] = ModelConfig(tiny={"initializer_range": 0.5}, seed=0,
                                          attn_implementation="eager")
    trainer = StacxTrainer(config, source=InMemoryBatchSource([]))
    policy = trainer.models["policy"].module
    assert policy is not None
    return trainer, policy.backbone  # type: ignore[return-value]


def test_frozen_policy_at_t07_has_ratio_one_on_every_token() -> None:
    trainer, backbone = _trainer()
    batch = _rollout_batch(backbone)
    assert batch.temperatures is not None and set(batch.temperatures.tolist()) == {
        np.float32(TEMPERATURE)}
    tensors = to_tensor_batch(batch)
    with torch.no_grad():
        logits = backbone(input_ids=tensors.input_ids,
                          attention_mask=tensors.attention_mask).logits
    trainer_logp = TokenLogprobs().extract_model_output(ModelOutput(logits=logits),
                                                        tensors)["logprobs"]
    on = tensors.loss_mask > 0
    ratio = torch.exp(trainer_logp - tensors.old_logprobs)[on]
    assert ratio.numel() > 20
    assert (ratio - 1).abs().max().item() < 1e-5

    loss, metrics = trainer.forward_backward(batch)  # the whole GRPO step, before any update
    assert metrics["policy/clip_frac"] == 0.0
    assert abs(metrics["policy/ratio_min"] - 1) < 1e-5 and abs(metrics["policy/ratio_max"] - 1) < 1e-5
    assert metrics["policy/mismatch_abs_max"] < 1e-5


def test_ignoring_the_temperature_would_clip_tokens_of_an_unchanged_policy() -> None:
    """The control: the same rollouts scored at T = 1 (what the trainer did before) are far off."""
    trainer, backbone = _trainer()
    batch = dataclasses.replace(_rollout_batch(backbone), temperatures=None)
    _, metrics = trainer.forward_backward(batch)
    assert metrics["policy/clip_frac"] > 0.1
    assert metrics["policy/mismatch_abs_max"] > 0.2
