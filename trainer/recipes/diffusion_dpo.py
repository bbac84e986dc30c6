"""Diffusion-DPO: preference optimisation of a flow model against a frozen reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.losses import diffusion_dpo_loss
from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.dpo import preference_pairs
from stacx.trainer.specialization import FlowErrors


@dataclass(kw_only=True, slots=True)
class DiffusionDPO(FlowErrors):
    """e(y) = mean_k squared velocity error, same (noise, time) for policy and reference;
    L = mean_pairs -log sigma(-beta ((e_c - e_ref_c) - (e_r - e_ref_r))); pairs are the best
    and worst reward of each group."""

    beta: float = 1.0

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = preference_pairs(batch)  # [P], [P]
        policy = outputs["flow_error"].mean(-1)  # [B]
        ref = batch.extras["ref_flow_error"].mean(-1).to(policy.dtype)  # [B]
        return diffusion_dpo_loss(policy[chosen], ref[chosen], policy[rejected], ref[rejected],
                                  beta=self.beta, norm=batch.normaliser)


@recipe("diffusion_dpo")
def diffusion_dpo() -> TrainingConfig:
    """Diffusion-DPO: preference denoising of a flow policy vs a frozen reference on pairs."""
    return TrainingConfig(
        models=[ModelSlot(name="policy", head="flow"),
                ModelSlot(name="reference", head="flow", trainable=False)],
        roles=[Role(name="reference", specialization=FlowErrors(), models=("reference",)),
               Role(name="policy", specialization=DiffusionDPO())],
        syncs=[DataSync(source="reference", output="flow_error", target="policy",
                        field="ref_flow_error")],
    )
