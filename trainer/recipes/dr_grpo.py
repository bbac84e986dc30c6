"""Dr. GRPO: GRPO without length and std biases (config only: reuses the GRPO specialization)."""

from __future__ import annotations

from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.grpo import GRPO

COMPLETION_BUDGET = 2048
"""Default constant length: the rollout evaluator's default `max_tokens`. Set `max_tokens` in
`role_options.policy` to your completion budget."""


@recipe("dr_grpo")
def dr_grpo() -> TrainingConfig:
    """Dr. GRPO: unscaled group advantages, token sums over a constant length, no KL."""
    spec = GRPO(scale_by_std=False, aggregation="seq-mean-token-sum-norm",
                max_tokens=COMPLETION_BUDGET, kl_beta=0.0)
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=spec)],
    )
