"""GRPO: group-relative advantages, PPO clipping, a KL penalty to a frozen reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import (
    Aggregation,
    KLEstimator,
    check_kl_estimator,
    group_advantages,
    kl_estimate,
    ppo_clip_loss,
)
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import PolicyGradient, TokenLogprobs


@dataclass(kw_only=True, slots=True)
class GRPO(PolicyGradient):
    """Also serves DAPO and Dr. GRPO (other clip, aggregation, std and KL options)."""

    aggregation: Aggregation = "seq-mean-token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_beta: float = 0.04
    """Weight of the KL to `ref_logprobs` (0 disables it and needs no reference)."""
    kl_estimator: KLEstimator = "k3"
    """Per-token KL estimator: `k1`, `k2` or `k3`."""
    scale_by_std: bool = True
    """Divide advantages by the group's std (False: Dr. GRPO)."""

    def validate(self) -> None:
        PolicyGradient.validate(self)
        check_kl_estimator(self.kl_estimator)

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        adv = batch.advantages
        if adv is None:
            adv = group_advantages(batch.rewards, batch.group_index, scale_by_std=self.scale_by_std)
        return batch.with_extras(advantages=adv)  # [B]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = outputs["logprobs"], batch.loss_mask  # [B, T]
        adv = batch.extras["advantages"].to(logp.dtype).unsqueeze(-1)  # [B, 1]
        old, weights, metrics = self.anchor(logp, batch)
        loss, pg_metrics = ppo_clip_loss(
            logp, old, adv, mask, clip_low=self.clip_low, clip_high=self.clip_high,
            dual_clip=self.dual_clip, weights=weights, aggregation=self.aggregation,
            max_tokens=self.max_tokens, norm=batch.normaliser)
        metrics.update(pg_metrics)
        if self.kl_beta > 0:
            kl = self.reduce(kl_estimate(logp, batch.extras["ref_logprobs"], self.kl_estimator),
                             batch)
            loss = loss + self.kl_beta * kl
            metrics["kl"] = kl.item()
        return loss, metrics


@recipe("grpo")
def grpo() -> TrainingConfig:
    """GRPO: group-normalised advantages, PPO clip, k3 KL to a frozen reference."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="reference", trainable=False)],
        roles=[Role(name="reference", specialization=TokenLogprobs(), models=("reference",)),
               Role(name="policy", specialization=GRPO())],
        syncs=[DataSync(source="reference", output="logprobs", target="policy",
                        field="ref_logprobs")],
    )
