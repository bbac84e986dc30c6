"""DAgger: imitate the teacher's action on every state the student visited."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import Aggregation, nll_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import Aggregated


@dataclass(kw_only=True, slots=True)
class DAgger(Aggregated):
    """Each row is a student state s_i (prompt and history, mask 0) followed by the teacher's
    action a*_i = pi*(s_i) (mask 1), relabelled by the rollout engine's teacher:

        L = 1/N sum_i 1/|a*_i| sum_t -log pi(a*_i,t | s_i, a*_i,<t)

    Every visited state weighs the same whatever the length of its label. The aggregated data
    set D_1 u ... u D_n of the paper is the retained batches topic (replay it to retrain)."""

    aggregation: Aggregation = "seq-mean-token-mean"

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return nll_loss(outputs["logprobs"], batch.loss_mask, aggregation=self.aggregation,
                        max_tokens=self.max_tokens, norm=batch.normaliser)  # [B, T]


@recipe("dagger")
def dagger() -> TrainingConfig:
    """DAgger: NLL of the teacher's relabelled action on each student-visited state."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=DAgger())],
    )
