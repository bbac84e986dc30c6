"""RLOO: REINFORCE with a leave-one-out group baseline."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.batch import TensorBatch
from trainer.losses import ppo_clip_loss, rloo_advantages
from trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from trainer.specialization import TokenLogprobs, behaviour_logprobs


@dataclass(kw_only=True, slots=True)
class RLOO(TokenLogprobs):
    """Advantage r_i - mean(r_j, j != i in the group); clipped ratio for off-policy safety."""

    clip: float = 0.2

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        return batch.with_extras(advantages=rloo_advantages(batch.rewards, batch.group_index))

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs["logprobs"]  # [B, T]
        adv = batch.extras["advantages"].unsqueeze(-1)  # [B, 1]
        return ppo_clip_loss(logp, behaviour_logprobs(logp, batch), adv, batch.loss_mask,
                             clip_low=self.clip, clip_high=self.clip)


@recipe("rloo")
def rloo() -> TrainingConfig:
    """RLOO: REINFORCE with a leave-one-out baseline within each group."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=RLOO())],
    )
