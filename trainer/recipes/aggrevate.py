"""AggreVaTe: prefer the actions whose teacher roll-outs cost least from the student's state."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import Aggregation, group_advantages, policy_gradient_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import Aggregated


@dataclass(kw_only=True, slots=True)
class AggreVaTe(Aggregated):
    """A group is one student state s; its rows are candidate actions a_j at s, each followed by
    the teacher to the end of the episode, so r_j = Q*(s, a_j) estimates the teacher's
    return-to-go (negated cost-to-go). With the state value V*(s) = mean_j Q*(s, a_j):

        L = -1/N sum_j (Q*(s, a_j) - V*(s)) * 1/|a_j| sum_t log pi(a_j,t | s, a_j,<t)

    the cost-sensitive classification of AggreVaTe in its differentiable form (AggreVaTeD,
    Sun et al. 2017). Only the action tokens carry loss mask 1."""

    aggregation: Aggregation = "seq-mean-token-mean"
    scale_by_std: bool = False
    """Divide Q* - V* by the group's std (False keeps the cost scale, as AggreVaTe)."""

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        adv = group_advantages(batch.rewards, batch.group_index, scale_by_std=self.scale_by_std)
        return batch.with_extras(advantages=adv)  # [B]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs["logprobs"]  # [B, T]
        adv = batch.extras["advantages"].to(logp.dtype).unsqueeze(-1)  # [B, 1]
        loss, metrics = policy_gradient_loss(logp, adv, batch.loss_mask,
                                             aggregation=self.aggregation,
                                             max_tokens=self.max_tokens, norm=batch.normaliser)
        metrics["q_spread"] = batch.extras["advantages"].abs().mean().item()
        return loss, metrics


@recipe("aggrevate")
def aggrevate() -> TrainingConfig:
    """AggreVaTe: advantage of each action at a student state from the teacher's roll-outs."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=AggreVaTe())],
    )
