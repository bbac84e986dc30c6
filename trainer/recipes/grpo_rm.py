"""GRPO on a frozen learned reward model's scores."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import group_advantages
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.grpo import GRPO
from stacx.trainer.recipes.online_reward import RewardModel
from stacx.trainer.specialization import TokenLogprobs


@dataclass(kw_only=True, slots=True)
class LearnedRewardGRPO(GRPO):
    """r'_i = s_RM(y_i) + w_env * r_i; A_i = group-normalised r'_i; then GRPO's loss (PPO clip,
    k3 KL to the reference)."""

    env_weight: float = 0.0
    """Weight of the environment's own reward next to the reward model's score."""

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        return batch  # advantages need the synced scores

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        scores = batch.extras["rm_scores"] + self.env_weight * batch.rewards  # [B]
        adv = group_advantages(scores, batch.group_index, scale_by_std=self.scale_by_std)
        loss, metrics = GRPO.compute_loss(self, outputs, batch.with_extras(advantages=adv))
        metrics["rm_score_mean"] = batch.extras["rm_scores"].mean().item()
        return loss, metrics


@recipe("grpo_rm")
def grpo_rm() -> TrainingConfig:
    """GRPO with a learned reward: a frozen reward model (`models.reward`) scores each sample."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="reference", trainable=False),
                ModelSlot(name="reward", head="value", trainable=False, init="reward")],
        roles=[Role(name="reward", specialization=RewardModel(), models=("reward",)),
               Role(name="reference", specialization=TokenLogprobs(), models=("reference",)),
               Role(name="policy", specialization=LearnedRewardGRPO())],
        syncs=[DataSync(source="reward", output="scores", target="policy", field="rm_scores"),
               DataSync(source="reference", output="logprobs", target="policy",
                        field="ref_logprobs")],
    )
