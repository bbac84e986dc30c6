"""RLOO: REINFORCE with a leave-one-out group baseline."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import ppo_clip_loss, rloo_advantages
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import PolicyGradient


@dataclass(kw_only=True, slots=True)
class RLOO(PolicyGradient):
    """Advantage r_i - mean(r_j, j != i in the group); clipped ratio for off-policy safety."""

    clip: float = 0.2

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        return batch.with_extras(advantages=rloo_advantages(batch.rewards, batch.group_index))

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs["logprobs"]  # [B, T]
        adv = batch.extras["advantages"].to(logp.dtype).unsqueeze(-1)  # [B, 1]
        old, weights, metrics = self.anchor(logp, batch)
        loss, pg_metrics = ppo_clip_loss(
            logp, old, adv, batch.loss_mask, clip_low=self.clip, clip_high=self.clip,
            dual_clip=self.dual_clip, weights=weights, aggregation=self.aggregation,
            max_tokens=self.max_tokens, norm=batch.normaliser)
        return loss, metrics | pg_metrics


@recipe("rloo")
def rloo() -> TrainingConfig:
    """RLOO: REINFORCE with a leave-one-out baseline within each group."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=RLOO())],
    )
