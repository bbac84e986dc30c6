"""Shipped recipes: one module per algorithm (config + at most one specialization)."""

from trainer.recipes import (  # noqa: F401  (import registers each recipe)
    dapo,
    dpo,
    dpo_distributed,
    dr_grpo,
    grpo,
    gspo,
    online_reward,
    opd,
    ppo,
    ppo_colocated,
    reinforce_pp,
    rloo,
    sft,
)

__all__: list[str] = []
