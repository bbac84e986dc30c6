"""ORPO: SFT on the chosen response plus an odds-ratio preference term, no reference model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.batch import TensorBatch
from trainer.losses import masked_mean, orpo_loss
from trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from trainer.recipes.dpo import preference_pairs
from trainer.specialization import TokenLogprobs


@dataclass(kw_only=True, slots=True)
class ORPO(TokenLogprobs):
    """a(y) = avg log pi(y), log odds(y) = a(y) - log(1 - exp a(y));
    L = mean_pairs [-a(y_c) - lam * log sigma(log odds(y_c) - log odds(y_r))]."""

    lam: float = 0.1
    """Weight of the odds-ratio term (TRL `beta`)."""

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = preference_pairs(batch)  # [P], [P]
        # avg logprob < 0 strictly: log1p(-exp(a)) needs a < 0 (a token prob of 1 would be -inf)
        avg = masked_mean(outputs["logprobs"], batch.loss_mask, dim=-1).clamp(max=-1e-6)  # [B]
        return orpo_loss(avg[chosen], avg[rejected], -avg[chosen], lam=self.lam,
                         norm=batch.normaliser)


@recipe("orpo")
def orpo() -> TrainingConfig:
    """ORPO: NLL of the chosen response plus an odds-ratio preference term, no reference."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=ORPO())],
    )
