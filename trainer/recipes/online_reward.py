"""Online reward modelling: a policy and a reward model trained together."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.errors import RecipeError
from stacx.trainer.losses import group_advantages, mse_loss
from stacx.trainer.protocols import ModelOutput
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.grpo import GRPO
from stacx.trainer.specialization import TokenLogprobs


@dataclass(kw_only=True, slots=True)
class RewardModel(TokenLogprobs):
    """Score = value head at the last real token, regressed on the environment reward."""

    def extract_model_output(self, output: ModelOutput,
                             batch: TensorBatch) -> dict[str, torch.Tensor]:
        if output.values is None:
            raise RecipeError("the reward role needs a `value` head on its slot")
        last = (batch.lengths - 1).unsqueeze(-1)  # [B, 1]
        return {"scores": output.values.gather(1, last).squeeze(-1)}  # [B]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return mse_loss(outputs["scores"], batch.rewards, norm=batch.normaliser)


@dataclass(kw_only=True, slots=True)
class RewardModelPolicy(GRPO):
    """GRPO on the reward model's (synced, detached) scores instead of the raw rewards."""

    kl_beta: float = 0.0

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        return batch

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        adv = group_advantages(batch.extras["rm_scores"], batch.group_index)  # [B]
        return GRPO.compute_loss(self, outputs, batch.with_extras(advantages=adv))


@recipe("online_reward")
def online_reward() -> TrainingConfig:
    """Policy trained on a reward model's scores while the reward model fits the rewards."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="reward", head="value")],
        roles=[Role(name="reward", specialization=RewardModel(), models=("reward",)),
               Role(name="policy", specialization=RewardModelPolicy())],
        syncs=[DataSync(source="reward", output="scores", target="policy", field="rm_scores")],
    )
