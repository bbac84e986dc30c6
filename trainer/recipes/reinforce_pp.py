"""REINFORCE++: token-level KL-shaped returns, batch-whitened advantages, PPO clip."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.batch import TensorBatch
from trainer.losses import kl_k1, masked_whiten, ppo_clip_loss, returns_to_go
from trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from trainer.specialization import TokenLogprobs, behaviour_logprobs, terminal_rewards


@dataclass(kw_only=True, slots=True)
class ReinforcePP(TokenLogprobs):
    """r_t = -beta * k1(t) (+ reward on the last token); A = whiten(returns-to-go) over the batch."""

    kl_beta: float = 0.01
    gamma: float = 1.0
    clip: float = 0.2

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = outputs["logprobs"], batch.loss_mask  # [B, T]
        old = behaviour_logprobs(logp, batch)
        kl = kl_k1(old, batch.extras["ref_logprobs"]) * mask  # [B, T]
        token_rewards = terminal_rewards(batch) - self.kl_beta * kl
        adv = masked_whiten(returns_to_go(token_rewards, mask, self.gamma), mask)  # [B, T]
        loss, metrics = ppo_clip_loss(logp, old, adv, mask, clip_low=self.clip,
                                      clip_high=self.clip)
        metrics["kl"] = (kl.sum() / mask.sum().clamp(min=1.0)).item()
        return loss, metrics


@recipe("reinforce_pp")
def reinforce_pp() -> TrainingConfig:
    """REINFORCE++: KL-shaped token returns, globally whitened advantages, PPO clip."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="reference", trainable=False)],
        roles=[Role(name="reference", specialization=TokenLogprobs(), models=("reference",)),
               Role(name="policy", specialization=ReinforcePP())],
        syncs=[DataSync(source="reference", output="logprobs", target="policy",
                        field="ref_logprobs")],
    )
