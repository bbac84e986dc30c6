"""DAPO's loss: decoupled clip-higher, token-level mean, no KL (config only: reuses GRPO)."""

from __future__ import annotations

from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.grpo import GRPO


@recipe("dapo")
def dapo() -> TrainingConfig:
    """DAPO loss: clip-higher (0.2/0.28), token-level mean, no KL to a reference."""
    spec = GRPO(clip_low=0.2, clip_high=0.28, aggregation="token-mean", kl_beta=0.0)
    return TrainingConfig(
        models=[ModelSlot(name="policy")],
        roles=[Role(name="policy", specialization=spec)],
    )
