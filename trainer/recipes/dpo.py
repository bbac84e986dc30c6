"""DPO: sigmoid preference loss against a frozen reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import dpo_loss, sequence_logprobs
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import TokenLogprobs


def preference_pairs(batch: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) row indices [P]: highest and lowest reward of every group of >= 2."""
    chosen, rejected = [], []
    for g in torch.unique(batch.group_index).tolist():
        rows = torch.nonzero(batch.group_index == g).squeeze(-1)
        if len(rows) >= 2:
            order = rows[torch.argsort(batch.rewards[rows], descending=True, stable=True)]
            chosen.append(order[0])
            rejected.append(order[-1])
    if not chosen:  # only groups of one here: no pairs
        none = torch.zeros(0, dtype=torch.long, device=batch.rewards.device)
        return none, none
    return torch.stack(chosen), torch.stack(rejected)


@dataclass(kw_only=True, slots=True)
class DPO(TokenLogprobs):
    """Pairs come from groups: the best and worst reward of each prompt group."""

    beta: float = 0.1
    label_smoothing: float = 0.0

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = preference_pairs(batch)  # [P], [P]
        policy = sequence_logprobs(outputs["logprobs"], batch.loss_mask)  # [B]
        ref = sequence_logprobs(batch.extras["ref_logprobs"], batch.loss_mask)  # [B]
        return dpo_loss(policy[chosen], policy[rejected], ref[chosen], ref[rejected],
                        beta=self.beta, label_smoothing=self.label_smoothing,
                        norm=batch.normaliser)


@recipe("dpo")
def dpo() -> TrainingConfig:
    """DPO: sigmoid preference loss on (best, worst) pairs of each group vs a frozen reference."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="reference", trainable=False)],
        roles=[Role(name="reference", specialization=TokenLogprobs(), models=("reference",)),
               Role(name="policy", specialization=DPO())],
        syncs=[DataSync(source="reference", output="logprobs", target="policy",
                        field="ref_logprobs")],
    )
