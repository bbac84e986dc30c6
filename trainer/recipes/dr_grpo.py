"""Dr. GRPO: GRPO without length and std biases (config only: reuses the GRPO specialization)."""

from __future__ import annotations

from trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from trainer.recipes.grpo import GRPO


@recipe("dr_grpo")
def dr_grpo() -> TrainingConfig:
    """Dr. GRPO: unscaled group advantages, constant-length token sums, no KL."""
    spec = GRPO(scale_by_std=False, aggregation="seq-mean-token-sum-norm", kl_beta=0.0)
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=spec)],
    )
