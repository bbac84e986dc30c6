"""The two diffusion recipes fine-tune a 2-D flow policy online through the ordinary trainer:
sample from the policy, score, pack as a TrainingBatch, one step; the reward must rise.

The task: the untrained flow maps noise to roughly N(0, I); the reward is -||x - (1.5, 1.5)||^2,
about -6.3 on average before training, 0 at best. Bounded: 30 rounds of 128 samples (seconds).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from stacx.trainer import InMemoryBatchSource, StacxTrainer
from stacx.trainer.flow import FlowModel, decode_points, point_batch
from stacx.trainer.testing import tiny_trainer_config

TARGET = torch.tensor([1.5, 1.5])


def reward(points: torch.Tensor) -> torch.Tensor:
    return -((points - TARGET) ** 2).sum(-1)


def online(recipe: str, options: dict[str, Any], *, group_size: int, rounds: int = 30,
           lr: float = 1e-2) -> tuple[float, float, StacxTrainer]:
    """(mean reward before, after, the trainer) of an online run: sample, score, train."""
    torch.set_num_threads(1)
    config = tiny_trainer_config(recipe, lr=lr, role_options={"policy": options})
    trainer = StacxTrainer(config, source=InMemoryBatchSource([]))
    policy = trainer.models["policy"].module
    assert isinstance(policy, FlowModel)
    gen = torch.Generator().manual_seed(0)
    before = reward(policy.sample(1024, generator=gen)).mean().item()
    for r in range(rounds):
        points = policy.sample(128, generator=gen)
        trainer.train_step(point_batch(f"{recipe}-{r}", points, reward(points),
                                       group_size=group_size))
    after = reward(policy.sample(1024, generator=gen)).mean().item()
    return before, after, trainer


def test_points_survive_the_batch_encoding() -> None:
    from stacx.trainer.batch import to_tensor_batch

    points = torch.tensor([[0.25, -1.5], [3.0, 0.001]])
    batch = to_tensor_batch(point_batch("p", points, torch.zeros(2)))
    assert torch.allclose(decode_points(batch.input_ids), points, atol=1 / 4096)
    assert batch.loss_mask.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_diffusion_rwfm_raises_the_reward() -> None:
    before, after, _ = online("diffusion_rwfm", {"temperature": 1.0}, group_size=1)
    assert before < -5.0
    assert after > -1.5, f"reward-weighted flow matching: mean reward {before:.2f} -> {after:.2f}"


def test_diffusion_dpo_raises_the_reward_and_wins_against_the_reference() -> None:
    before, after, trainer = online("diffusion_dpo", {"beta": 1.0}, group_size=2)
    assert before < -5.0
    assert after > -1.5, f"diffusion DPO: mean reward {before:.2f} -> {after:.2f}"
    reference = trainer.models["reference"].module
    assert isinstance(reference, FlowModel)
    gen = torch.Generator().manual_seed(1)
    ours = reward(trainer.models["policy"].module.sample(512, generator=gen))  # type: ignore[union-attr]
    theirs = reward(reference.sample(512, generator=gen))
    assert (ours > theirs).float().mean().item() > 0.8  # preference win rate vs the reference


def test_policy_and_reference_share_noise_draws() -> None:
    """Diffusion-DPO compares errors under the same (x0, t): equal weights give equal errors."""
    config = tiny_trainer_config("diffusion_dpo")
    trainer = StacxTrainer(config, source=InMemoryBatchSource([]))
    batch = point_batch("p", torch.randn(4, 2), torch.rand(4), group_size=2)
    from stacx.trainer.batch import to_tensor_batch

    tensors = to_tensor_batch(batch)
    with torch.no_grad():
        a = trainer.models["policy"].module(tensors.input_ids, tensors.attention_mask)  # type: ignore[misc]
        b = trainer.models["reference"].module(tensors.input_ids, tensors.attention_mask)  # type: ignore[misc]
    assert torch.equal(a.flow_error, b.flow_error)


@pytest.mark.parametrize("bad", [{"temperature": 0.0}])
def test_bad_options_name_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="temperature"):
        StacxTrainer(tiny_trainer_config("diffusion_rwfm", role_options={"policy": bad}),
                     source=InMemoryBatchSource([]))
