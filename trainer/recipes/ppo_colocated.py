"""PPO with one model as actor and critic (shared trunk, value head): config only."""

from __future__ import annotations

from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.ppo import PPO, Critic


@recipe("ppo_colocated")
def ppo_colocated() -> TrainingConfig:
    """PPO where actor and critic share one model (LM head + value head, one forward pass)."""
    return TrainingConfig(
        models=[ModelSlot(name="policy", head="lm+value")],
        roles=[Role(name="critic", specialization=Critic()),
               Role(name="policy", specialization=PPO())],
        syncs=[DataSync(source="critic", output="values", target="policy", field="values")],
    )
