"""ReMax: REINFORCE with the greedy response's reward as the baseline."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.errors import RecipeError
from stacx.trainer.losses import policy_gradient_loss, remax_advantages
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import Aggregated


@dataclass(kw_only=True, slots=True)
class ReMax(Aggregated):
    """L = -1/N sum_i A_i * 1/n_i sum_t log pi(y_it), A_i = r_i - r(greedy response of the same
    prompt). Each group carries one greedy row (sampled at temperature 0); it is the baseline
    and is not trained."""

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        if batch.greedy is None or not bool(batch.greedy.any()):
            raise RecipeError(f"remax: batch {batch.batch_id!r} has no greedy row; sample one "
                              "response per prompt at temperature 0 (its reward is the baseline)")
        adv = remax_advantages(batch.rewards, batch.group_index, batch.greedy)  # [B]
        trained = (~batch.greedy).to(batch.loss_mask.dtype).unsqueeze(-1)  # [B, 1]
        return replace(batch, loss_mask=batch.loss_mask * trained).with_extras(advantages=adv)

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logp = outputs["logprobs"]  # [B, T]
        adv = batch.extras["advantages"].to(logp.dtype).unsqueeze(-1)  # [B, 1]
        return policy_gradient_loss(logp, adv, batch.loss_mask, aggregation=self.aggregation,
                                    max_tokens=self.max_tokens, norm=batch.normaliser)


@recipe("remax")
def remax() -> TrainingConfig:
    """ReMax: REINFORCE with the greedy response's reward as each prompt's baseline."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=ReMax(aggregation="seq-mean-token-mean"))],
        needs_greedy_row=True,
    )
