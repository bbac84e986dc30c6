"""Shared building blocks for specializations (the per-algorithm code lives in trainer/recipes/)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.batch import TensorBatch
from trainer.errors import RecipeError
from trainer.losses import token_logprobs
from trainer.protocols import ModelOutput

__all__ = ["TokenLogprobs", "behaviour_logprobs", "terminal_rewards"]


@dataclass(kw_only=True, slots=True)
class TokenLogprobs:
    """Logprobs of the target tokens; no loss. Frozen roles (reference, teacher) use it as is."""

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        return batch

    def extract_model_output(self, output: ModelOutput,
                             batch: TensorBatch) -> dict[str, torch.Tensor]:
        if output.logits is None:
            raise RecipeError(f"{type(self).__name__} needs logits: give its slot an `lm` head")
        return {"logprobs": token_logprobs(output.logits[:, :-1], batch.targets)}  # [B, T]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise RecipeError(f"{type(self).__name__} has no loss: its role must use a frozen slot")


def behaviour_logprobs(logp: torch.Tensor, batch: TensorBatch) -> torch.Tensor:
    """Sampling logprobs [B, T] for importance ratios.

    Rows whose recorded logprobs are all 0 on the mask carry none (e.g. replayed SFT data): they
    use the current policy's detached logprobs, i.e. ratio 1 (a purely on-policy update).
    """
    recorded = (batch.old_logprobs * batch.loss_mask).abs().sum(-1, keepdim=True) > 0  # [B, 1]
    return torch.where(recorded, batch.old_logprobs, logp.detach())


def terminal_rewards(batch: TensorBatch) -> torch.Tensor:
    """[B, T] token rewards: the sequence reward on its last masked token, 0 elsewhere."""
    mask = batch.loss_mask
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(-1).values  # [B]
    out = torch.zeros_like(mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = batch.rewards[rows].to(out.dtype)
    return out
