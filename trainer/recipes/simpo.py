"""SimPO: reference-free preference loss on length-averaged logprobs with a target margin."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import masked_mean, simpo_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.dpo import preference_pairs
from stacx.trainer.specialization import TokenLogprobs


@dataclass(kw_only=True, slots=True)
class SimPO(TokenLogprobs):
    """L = mean_pairs -log sigma(beta * (avg log pi(y_c) - avg log pi(y_r)) - gamma); pairs are
    the best and worst reward of each group."""

    beta: float = 2.0
    gamma: float = 1.0
    """Target reward margin (TRL `simpo_gamma`)."""

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = preference_pairs(batch)  # [P], [P]
        avg = masked_mean(outputs["logprobs"], batch.loss_mask, dim=-1)  # [B]
        return simpo_loss(avg[chosen], avg[rejected], beta=self.beta, gamma=self.gamma,
                          norm=batch.normaliser)


@recipe("simpo")
def simpo() -> TrainingConfig:
    """SimPO: length-normalised preference margin, no reference model."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=SimPO())],
    )
