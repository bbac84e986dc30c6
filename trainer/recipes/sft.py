"""Supervised fine-tuning."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import nll_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import Aggregated


@dataclass(kw_only=True, slots=True)
class SFT(Aggregated):
    """Negative log-likelihood of the loss-masked tokens (token mean over the global batch)."""

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return nll_loss(outputs["logprobs"], batch.loss_mask, aggregation=self.aggregation,
                        max_tokens=self.max_tokens, norm=batch.normaliser)  # [B, T]


@recipe("sft")
def sft() -> TrainingConfig:
    """Supervised fine-tuning: mean NLL of the loss-masked tokens."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=SFT())],
    )
