"""Process reward model: a score after every step (turn) of a trajectory."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.errors import RecipeError
from stacx.trainer.losses import process_reward_loss
from stacx.trainer.protocols import ModelOutput
from stacx.trainer.recipe import ModelSlot, Role, TrainingConfig, recipe
from stacx.trainer.specialization import TokenLogprobs


def step_ends(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the last loss-masked target of every contiguous masked run (one agent turn,
    i.e. one step)."""
    on = mask > 0
    following = torch.zeros_like(on)
    following[:, :-1] = on[:, 1:]
    return on & ~following


@dataclass(kw_only=True, slots=True)
class ProcessReward(TokenLogprobs):
    """s_k = value head on the last token of step k; y_k = the trajectory's reward clipped to
    [0, 1] (one Monte-Carlo roll-out's estimate that step k leads to success, Math-Shepherd's
    soft label); L = mean_steps BCE(sigma(s_k), y_k)."""

    def extract_model_output(self, output: ModelOutput,
                             batch: TensorBatch) -> dict[str, torch.Tensor]:
        if output.values is None:
            raise RecipeError("the prm role needs a `value` head on its slot")
        return {"step_scores": output.values[:, 1:]}  # [B, T]: state after each target token

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        ends = step_ends(batch.loss_mask)  # [B, T]
        labels = batch.rewards.clamp(0.0, 1.0).unsqueeze(-1).expand_as(ends)  # [B, T]
        scores = outputs["step_scores"]
        return process_reward_loss(scores[ends], labels[ends], norm=batch.normaliser)


@recipe("prm")
def prm() -> TrainingConfig:
    """Process reward model: BCE of a score after every agent turn against its success label."""
    return TrainingConfig(
        models=[ModelSlot(name="reward", head="value")],
        roles=[Role(name="reward", specialization=ProcessReward(), models=("reward",))],
        publish="reward",
    )
