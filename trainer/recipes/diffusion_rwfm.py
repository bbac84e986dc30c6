"""Reward-weighted flow matching: regress the velocity field on samples weighted by reward."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.errors import RecipeError
from stacx.trainer.losses import reward_weighted_flow_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import FlowErrors


@dataclass(kw_only=True, slots=True)
class RewardWeightedFlow(FlowErrors):
    """w = softmax(r / tau) over the batch; L = sum_i w_i mean_k ||v(x_t^ik, t_ik) -
    (x1_i - x0_ik)||^2 on the policy's own samples x1_i (online RW-CFM)."""

    temperature: float = 1.0
    """tau: lower concentrates the weight on the best samples."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise RecipeError(f"diffusion_rwfm: temperature={self.temperature} must be > 0")

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return reward_weighted_flow_loss(outputs["flow_error"], batch.rewards,
                                         temperature=self.temperature)


@recipe("diffusion_rwfm")
def diffusion_rwfm() -> TrainingConfig:
    """Reward-weighted flow matching of a flow/diffusion policy on its own scored samples."""
    return TrainingConfig(
        models=[ModelSlot(name="policy", head="flow")],
        roles=[Role(name="policy", specialization=RewardWeightedFlow())],
    )
