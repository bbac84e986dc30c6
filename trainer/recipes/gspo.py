"""GSPO: sequence-level importance ratios and clipping."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import Aggregation, group_advantages, gspo_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import PolicyGradient


@dataclass(kw_only=True, slots=True)
class GSPO(PolicyGradient):
    """Length-normalised sequence ratio, clipped in a narrow band (GSPO paper defaults)."""

    aggregation: Aggregation = "seq-mean-token-mean"
    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        adv = batch.advantages
        if adv is None:
            adv = group_advantages(batch.rewards, batch.group_index)
        return batch.with_extras(advantages=adv)  # [B]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs["logprobs"]  # [B, T]
        old, weights, metrics = self.anchor(logp, batch)
        loss, pg_metrics = gspo_loss(
            logp, old, batch.extras["advantages"].to(logp.dtype), batch.loss_mask,
            clip_low=self.clip_low, clip_high=self.clip_high, weights=weights,
            aggregation=self.aggregation, max_tokens=self.max_tokens, norm=batch.normaliser)
        return loss, metrics | pg_metrics


@recipe("gspo")
def gspo() -> TrainingConfig:
    """GSPO: group advantages with sequence-level importance ratio and clipping."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=GSPO())],
    )
