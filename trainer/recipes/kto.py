"""KTO: prospect-theoretic loss on single responses labelled desirable or undesirable."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import kto_loss, sequence_logprobs
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import TokenLogprobs


@dataclass(kw_only=True, slots=True)
class KTO(TokenLogprobs):
    """rho_i = log pi(y_i) - log ref(y_i) (sequence sums), z0 = sg(max(0, mean_i rho_i));
    L = mean_i [w_d (1 - sigma(beta (rho_i - z0)))  if r_i > threshold
                else w_u (1 - sigma(beta (z0 - rho_i)))]."""

    beta: float = 0.1
    desirable_threshold: float = 0.5
    """A response is desirable when its reward exceeds this."""
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        rows = batch.loss_mask.sum(-1) > 0  # [B] rows with a response
        policy = sequence_logprobs(outputs["logprobs"], batch.loss_mask)[rows]  # [B']
        ref = sequence_logprobs(batch.extras["ref_logprobs"], batch.loss_mask)[rows]
        desirable = (batch.rewards > self.desirable_threshold)[rows]
        return kto_loss(policy, ref.to(policy.dtype), desirable, beta=self.beta,
                        desirable_weight=self.desirable_weight,
                        undesirable_weight=self.undesirable_weight, norm=batch.normaliser)


@recipe("kto")
def kto() -> TrainingConfig:
    """KTO: desirable/undesirable responses (reward threshold) vs a frozen reference, no pairs."""
    return TrainingConfig(
        models=[ModelSlot(name="policy"), ModelSlot(name="reference", trainable=False)],
        roles=[Role(name="reference", specialization=TokenLogprobs(), models=("reference",)),
               Role(name="policy", specialization=KTO())],
        syncs=[DataSync(source="reference", output="logprobs", target="policy",
                        field="ref_logprobs")],
    )
