"""Bradley-Terry reward model trained on preference pairs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import bradley_terry_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.dpo import preference_pairs
from stacx.trainer.recipes.online_reward import RewardModel


@dataclass(kw_only=True, slots=True)
class BradleyTerry(RewardModel):
    """s(y) = value head at the last real token; L = mean_pairs [-log sigma(s_c - s_r)
    + c (s_c + s_r)^2]; pairs are the best and worst reward of each group."""

    center_coef: float = 0.01
    """Pulls scores towards 0 (TRL `center_rewards_coefficient`, 0.01 as its docs suggest): the
    Bradley-Terry term alone is blind to a shift of all scores, so their offset would drift."""

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = preference_pairs(batch)  # [P], [P]
        scores = outputs["scores"]  # [B]
        return bradley_terry_loss(scores[chosen], scores[rejected], center_coef=self.center_coef,
                                  norm=batch.normaliser)


@recipe("reward_bt")
def reward_bt() -> TrainingConfig:
    """Bradley-Terry reward model on (best, worst) pairs of each group; publishes the scorer."""
    return TrainingConfig(
        models=[ModelSlot(name="reward", head="value")],
        roles=[Role(name="reward", specialization=BradleyTerry(), models=("reward",))],
        publish="reward",
    )
