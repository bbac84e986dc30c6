"""Shipped recipes: one module per algorithm (config + at most one specialization)."""

from stacx.trainer.recipes import (  # noqa: F401  (import registers each recipe)
    aggrevate,
    cispo,
    dagger,
    dapo,
    diffusion_dpo,
    diffusion_rwfm,
    dpo,
    dpo_distributed,
    dr_grpo,
    grpo,
    grpo_rm,
    gspo,
    kto,
    online_reward,
    opd,
    opd_served,
    orpo,
    ppo,
    ppo_colocated,
    prm,
    reinforce_pp,
    remax,
    reward_bt,
    rloo,
    sft,
    simpo,
)

__all__: list[str] = []
