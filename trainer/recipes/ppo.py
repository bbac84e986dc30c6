"""PPO with a learned critic and GAE."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.errors import RecipeError
from stacx.trainer.losses import gae, masked_whiten, ppo_clip_loss, value_loss
from stacx.trainer.protocols import ModelOutput
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import PolicyGradient, TokenLogprobs, terminal_rewards


@dataclass(kw_only=True, slots=True)
class Critic(TokenLogprobs):
    """Value per target position, regressed on GAE returns."""

    gamma: float = 1.0
    lam: float = 0.95

    def extract_model_output(self, output: ModelOutput,
                             batch: TensorBatch) -> dict[str, torch.Tensor]:
        if output.values is None:
            raise RecipeError("the critic needs a `value` or `lm+value` head on its slot")
        return {"values": output.values[:, :-1]}  # [B, T]: state before each target token

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        values, mask = outputs["values"], batch.loss_mask  # [B, T]
        _, returns = gae(terminal_rewards(batch), values.detach(), mask, gamma=self.gamma,
                         lam=self.lam)
        return value_loss(values, returns, mask, norm=batch.normaliser)


@dataclass(kw_only=True, slots=True)
class PPO(PolicyGradient):
    """Clipped surrogate on GAE advantages from the critic's synced `values`, whitened over the
    global batch."""

    clip: float = 0.2
    gamma: float = 1.0
    lam: float = 0.95

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = outputs["logprobs"], batch.loss_mask  # [B, T]
        adv, _ = gae(terminal_rewards(batch), batch.extras["values"].to(logp.dtype), mask,
                     gamma=self.gamma, lam=self.lam)
        adv = masked_whiten(adv, mask, norm=batch.normaliser)  # [B, T]
        old, weights, metrics = self.anchor(logp, batch)
        loss, pg_metrics = ppo_clip_loss(
            logp, old, adv, mask, clip_low=self.clip, clip_high=self.clip,
            dual_clip=self.dual_clip, weights=weights, aggregation=self.aggregation,
            max_tokens=self.max_tokens, norm=batch.normaliser)
        return loss, metrics | pg_metrics


@recipe("ppo")
def ppo() -> TrainingConfig:
    """PPO: clipped policy loss with GAE advantages from a separate critic model."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="critic", head="value")],
        roles=[Role(name="critic", specialization=Critic(), models=("critic",)),
               Role(name="policy", specialization=PPO())],
        syncs=[DataSync(source="critic", output="values", target="policy", field="values")],
    )
