"""ORPO: SFT on the chosen response plus an odds-ratio preference term, no reference model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import masked_mean, orpo_loss
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.dpo import preference_pairs
from stacx.trainer.specialization import TokenLogprobs


@dataclass(kw_only=True, slots=True)
class ORPO(TokenLogprobs):
    """a(y) = avg log pi(y), log odds(y) = a(y) - log(1 - exp a(y)); L = token-mean NLL of the
    chosen responses - lam * mean_pairs log sigma(log odds(y_c) - log odds(y_r)) (TRL
    `ORPOTrainer`); pairs are the best and worst reward of each group."""

    lam: float = 0.1
    """Weight of the odds-ratio term (TRL `beta`)."""
    nll_on_prompt: bool = False
    """The NLL also counts the chosen rows' prompt and observation tokens, every real token but
    the first, as TRL does. Off: only the trained (loss-masked) tokens, so a model is never
    taught to predict its environment's observations."""

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = preference_pairs(batch)  # [P], [P]
        logp = outputs["logprobs"]  # [B, T]
        # avg logprob < 0 strictly: log(1 - exp(a)) needs a < 0 (a token prob of 1 would be -inf)
        avg = masked_mean(logp, batch.loss_mask, dim=-1).clamp(max=-1e-6)  # [B]
        nll_mask = batch.attention_mask[:, 1:].to(logp.dtype) if self.nll_on_prompt \
            else batch.loss_mask  # [B, T]
        return orpo_loss(avg[chosen], avg[rejected], logp[chosen], nll_mask[chosen],
                         lam=self.lam, norm=batch.normaliser)


@recipe("orpo")
def orpo() -> TrainingConfig:
    """ORPO: NLL of the chosen response plus an odds-ratio preference term, no reference."""
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=ORPO())],
    )
