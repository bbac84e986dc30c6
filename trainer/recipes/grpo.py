"""GRPO: group-relative advantages, PPO clipping, k3 KL to a frozen reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.batch import TensorBatch
from trainer.losses import Aggregation, group_advantages, kl_k3, masked_mean, ppo_clip_loss
from trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from trainer.specialization import TokenLogprobs, behaviour_logprobs


@dataclass(kw_only=True, slots=True)
class GRPO(TokenLogprobs):
    """Also serves Dr. GRPO (no std scaling, constant-length normalisation, no KL)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_beta: float = 0.04
    """Weight of the k3 KL to `ref_logprobs` (0 disables it and needs no reference)."""
    scale_by_std: bool = True
    aggregation: Aggregation = "seq-mean-token-mean"

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        adv = batch.advantages
        if adv is None:
            adv = group_advantages(batch.rewards, batch.group_index, scale_by_std=self.scale_by_std)
        return batch.with_extras(advantages=adv)  # [B]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = outputs["logprobs"], batch.loss_mask  # [B, T]
        adv = batch.extras["advantages"].unsqueeze(-1)  # [B, 1]
        loss, metrics = ppo_clip_loss(logp, behaviour_logprobs(logp, batch), adv, mask,
                                      clip_low=self.clip_low, clip_high=self.clip_high,
                                      aggregation=self.aggregation)
        if self.kl_beta > 0:
            kl = masked_mean(kl_k3(logp, batch.extras["ref_logprobs"]), mask)
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
