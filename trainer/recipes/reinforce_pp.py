"""REINFORCE++: token-level KL-shaped returns, batch-whitened advantages, PPO clip."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import (
    KLEstimator,
    check_kl_estimator,
    kl_estimate,
    masked_whiten,
    ppo_clip_loss,
    returns_to_go,
)
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import PolicyGradient, TokenLogprobs, terminal_rewards


@dataclass(kw_only=True, slots=True)
class ReinforcePP(PolicyGradient):
    """r_t = -beta * KL(t) (+ reward on the last token); A = whiten(returns-to-go) over the
    global batch; PPO clip."""

    kl_beta: float = 0.01
    kl_estimator: KLEstimator = "k1"
    """Estimator of the per-token KL in the reward (`k1`, `k2`, `k3`)."""
    gamma: float = 1.0
    clip: float = 0.2

    def validate(self) -> None:
        PolicyGradient.validate(self)
        check_kl_estimator(self.kl_estimator)

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = outputs["logprobs"], batch.loss_mask  # [B, T]
        old, weights, metrics = self.anchor(logp, batch)
        kl = kl_estimate(old, batch.extras["ref_logprobs"], self.kl_estimator) * mask  # [B, T]
        token_rewards = terminal_rewards(batch).to(logp.dtype) - self.kl_beta * kl
        adv = masked_whiten(returns_to_go(token_rewards, mask, self.gamma), mask,
                            norm=batch.normaliser)  # [B, T]
        loss, pg_metrics = ppo_clip_loss(
            logp, old, adv, mask, clip_low=self.clip, clip_high=self.clip,
            dual_clip=self.dual_clip, weights=weights, aggregation=self.aggregation,
            max_tokens=self.max_tokens, norm=batch.normaliser)
        metrics |= pg_metrics
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
