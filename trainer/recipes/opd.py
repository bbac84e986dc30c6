"""On-policy distillation: reverse KL to a frozen teacher on the student's own samples."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import reverse_kl_distill_loss
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import Aggregated, TokenLogprobs


@dataclass(kw_only=True, slots=True)
class OnPolicyDistill(Aggregated):
    """Per-token reverse KL(student || teacher), score-function gradient."""

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return reverse_kl_distill_loss(outputs["logprobs"], batch.extras["teacher_logprobs"],
                                       batch.loss_mask, aggregation=self.aggregation,
                                       max_tokens=self.max_tokens, norm=batch.normaliser)


@recipe("opd")
def opd() -> TrainingConfig:
    """On-policy distillation: reverse KL to a frozen teacher (`models.teacher`) per token."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"),
                ModelSlot(name="teacher", trainable=False, init="teacher")],
        roles=[Role(name="teacher", specialization=TokenLogprobs(), models=("teacher",)),
               Role(name="policy", specialization=OnPolicyDistill())],
        syncs=[DataSync(source="teacher", output="logprobs", target="policy",
                        field="teacher_logprobs")],
    )
