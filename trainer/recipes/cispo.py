"""CISPO: group advantages with a clipped, detached importance weight on every token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import cispo_loss, group_advantages
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import Aggregated, behaviour_logprobs


@dataclass(kw_only=True, slots=True)
class CISPO(Aggregated):
    """l_t = -sg(clip(pi_t / pi_old_t, floor, cap)) * A_i * log pi_t, token mean (MiniMax-M1),
    A_i = (r_i - mean_group r) / (std_group r + eps)."""

    ratio_cap: float = 5.0
    """Upper bound of the importance weight (TRL `epsilon_high` for `cispo`)."""
    ratio_floor: float = 0.0
    """Lower bound of the importance weight (0: none)."""

    def validate(self) -> None:
        Aggregated.validate(self)
        if not self.ratio_cap > self.ratio_floor >= 0.0:
            raise ValueError(f"ratio_cap={self.ratio_cap} must exceed ratio_floor="
                             f"{self.ratio_floor} >= 0")

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        adv = batch.advantages
        if adv is None:
            adv = group_advantages(batch.rewards, batch.group_index)
        return batch.with_extras(advantages=adv)  # [B]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs["logprobs"]  # [B, T]
        old, _ = behaviour_logprobs(logp, batch)
        adv = batch.extras["advantages"].to(logp.dtype).unsqueeze(-1)  # [B, 1]
        return cispo_loss(logp, old, adv, batch.loss_mask, ratio_cap=self.ratio_cap,
                          ratio_floor=self.ratio_floor, aggregation=self.aggregation,
                          max_tokens=self.max_tokens, norm=batch.normaliser)


@recipe("cispo")
def cispo() -> TrainingConfig:
    """CISPO: group advantages, clipped detached IS weight on every token, token mean, no KL."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=CISPO())],
    )
