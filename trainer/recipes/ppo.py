"""PPO with a learned critic and GAE."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.batch import TensorBatch
from trainer.errors import RecipeError
from trainer.losses import gae, masked_whiten, ppo_clip_loss, value_loss
from trainer.protocols import ModelOutput
from trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from trainer.specialization import TokenLogprobs, behaviour_logprobs, terminal_rewards


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
        return value_loss(values, returns, mask)


@dataclass(kw_only=True, slots=True)
class PPO(TokenLogprobs):
    """Clipped surrogate on whitened GAE advantages from the critic's synced `values`."""

    clip: float = 0.2
    gamma: float = 1.0
    lam: float = 0.95

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = outputs["logprobs"], batch.loss_mask  # [B, T]
        adv, _ = gae(terminal_rewards(batch), batch.extras["values"], mask, gamma=self.gamma,
                     lam=self.lam)
        return ppo_clip_loss(logp, behaviour_logprobs(logp, batch), masked_whiten(adv, mask),
                             mask, clip_low=self.clip, clip_high=self.clip)


@recipe("ppo")
def ppo() -> TrainingConfig:
    """PPO: clipped policy loss with GAE advantages from a separate critic model."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="critic", head="value")],
        roles=[Role(name="critic", specialization=Critic(), models=("critic",)),
               Role(name="policy", specialization=PPO())],
        syncs=[DataSync(source="critic", output="values", target="policy", field="values")],
    )
