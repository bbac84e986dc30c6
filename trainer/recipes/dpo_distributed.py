"""DPO with the reference model on its own worker group: config only."""

from __future__ import annotations

from stacx.trainer.recipe import DataSync, ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.recipes.dpo import DPO
from stacx.trainer.specialization import TokenLogprobs


@recipe("dpo_distributed")
def dpo_distributed() -> TrainingConfig:
    """DPO with the frozen reference on its own ranks; its logprobs are broadcast to the policy."""
    return TrainingConfig(
        models=[ModelSlot(name="policy", group="actor"),
                ModelSlot(name="reference", trainable=False, group="reference")],
        roles=[Role(name="reference", specialization=TokenLogprobs(), models=("reference",)),
               Role(name="policy", specialization=DPO())],
        syncs=[DataSync(source="reference", output="logprobs", target="policy",
                        field="ref_logprobs")],
        groups={"actor": 0, "reference": 1},
    )
