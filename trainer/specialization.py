"""Shared building blocks for specializations (the per-algorithm code lives in trainer/recipes/)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stacx.trainer.batch import TensorBatch
from stacx.trainer.errors import RecipeError
from stacx.trainer.losses import Aggregation, advantage_metrics, aggregate, check_aggregation, token_logprobs
from stacx.trainer.offpolicy import OffPolicyMode, check_off_policy, importance_weights, mismatch_metrics
from stacx.trainer.protocols import ModelOutput

__all__ = ["Aggregated", "FlowErrors", "PolicyGradient", "TokenLogprobs", "behaviour_logprobs",
           "terminal_rewards"]


@dataclass(kw_only=True, slots=True)
class TokenLogprobs:
    """Logprobs of the target tokens; no loss. Frozen roles (reference, teacher) use it as is.

    Each row is scored at its sampling temperature: log_softmax(logits / T_i), the distribution
    its recorded logprobs come from.
    """

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        return batch

    def extract_model_output(self, output: ModelOutput,
                             batch: TensorBatch) -> dict[str, torch.Tensor]:
        if output.logits is None:
            raise RecipeError(f"{type(self).__name__} needs logits: give its slot an `lm` head")
        logp = token_logprobs(output.logits[:, :-1], batch.targets, batch.temperatures)
        return {"logprobs": logp}  # [B, T]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise RecipeError(f"{type(self).__name__} has no loss: its role must use a frozen slot")


@dataclass(kw_only=True, slots=True)
class FlowErrors:
    """Squared velocity errors of a flow model per sample and draw; no loss (a frozen reference
    uses it as is, flow recipes extend it)."""

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch:
        return batch

    def extract_model_output(self, output: ModelOutput,
                             batch: TensorBatch) -> dict[str, torch.Tensor]:
        if output.flow_error is None:
            raise RecipeError(f"{type(self).__name__} needs a flow model: give its slot a "
                              "`flow` head")
        return {"flow_error": output.flow_error}  # [B, K]

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise RecipeError(f"{type(self).__name__} has no loss: its role must use a frozen slot")


def behaviour_logprobs(logp: torch.Tensor, batch: TensorBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampling logprobs [B, T], recorded [B] bool) for importance ratios.

    Rows without recorded logprobs (e.g. replayed SFT data; `batch.logprobs_recorded`) use the
    current policy's detached logprobs: ratio 1, a purely on-policy update. Recorded logprobs are
    used as they are, even when they are all 0.
    """
    recorded = batch.logprobs_recorded
    if recorded is None:
        recorded = torch.ones(logp.shape[0], dtype=torch.bool, device=logp.device)
    recorded = recorded.to(logp.device)
    old = torch.where(recorded.unsqueeze(-1), batch.old_logprobs.to(logp.dtype), logp.detach())
    return old, recorded


def terminal_rewards(batch: TensorBatch) -> torch.Tensor:
    """[B, T] token rewards: the sequence reward on its last masked token, 0 elsewhere."""
    mask = batch.loss_mask
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(-1).values  # [B]
    out = torch.zeros_like(mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = batch.rewards[rows].to(out.dtype)
    return out


@dataclass(kw_only=True, slots=True)
class Aggregated(TokenLogprobs):
    """A per-token loss reduced by one validated aggregation mode (losses.aggregate)."""

    aggregation: Aggregation = "token-mean"
    """`token-mean`, `seq-mean-token-mean`, `seq-mean-token-sum` or `seq-mean-token-sum-norm`;
    a KL term (if any) is aggregated the same way."""
    max_tokens: int | None = None
    """Constant length L of `seq-mean-token-sum-norm`: the completion budget (required there)."""

    def __post_init__(self) -> None:
        try:
            self.validate()
        except ValueError as exc:
            raise RecipeError(f"{type(self).__name__}: {exc}") from exc

    def validate(self) -> None:
        """Raise ValueError naming the bad option (subclasses extend it)."""
        check_aggregation(self.aggregation, self.max_tokens)

    def reduce(self, per_token: torch.Tensor, batch: TensorBatch) -> torch.Tensor:
        """Aggregate a [B, T] per-token term the way this role's loss is aggregated."""
        return aggregate(per_token, batch.loss_mask, self.aggregation, max_tokens=self.max_tokens,
                         norm=batch.normaliser)


@dataclass(kw_only=True, slots=True)
class PolicyGradient(Aggregated):
    """Options every policy-gradient specialization shares, validated at construction."""

    off_policy: OffPolicyMode = "none"
    """Importance-sampling correction: `none` (PPO clips around the behaviour logprobs),
    `token-truncate`, `token-mask`, `sequence-truncate` or `sequence-mask` (trainer/offpolicy.py)."""
    off_policy_cap: float = 2.0
    """Largest importance weight kept (truncated above it, or masked in the mask modes)."""
    off_policy_floor: float = 0.0
    """Mask modes also drop weights below this (0: none, as TRL)."""
    dual_clip: float | None = 3.0
    """Dual-clip constant c > 1 bounding the loss of negative advantages (None: off)."""

    def validate(self) -> None:
        Aggregated.validate(self)
        check_off_policy(self.off_policy, self.off_policy_cap, self.off_policy_floor)
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"dual_clip={self.dual_clip} must be > 1 (None disables it)")

    def anchor(self, logp: torch.Tensor, batch: TensorBatch
               ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """(PPO anchor [B, T], detached importance weights or None, off-policy metrics).

        `none`: the anchor is the behaviour logprobs. Otherwise it is the trainer's own detached
        logprobs, and the weights correct from the behaviour policy to it.
        """
        behaviour, recorded = behaviour_logprobs(logp, batch)
        mask = batch.loss_mask * recorded.unsqueeze(-1).to(batch.loss_mask.dtype)  # [B, T]
        metrics = mismatch_metrics(logp, behaviour, mask)
        advantages = batch.extras.get("advantages")
        if advantages is not None:  # the figures a verl or TRL user checks first
            metrics |= advantage_metrics(advantages, batch.loss_mask)
        if self.off_policy == "none":
            return behaviour, None, metrics
        weights, is_metrics = importance_weights(
            logp.detach(), behaviour, mask, mode=self.off_policy, cap=self.off_policy_cap,
            floor=self.off_policy_floor)
        return logp.detach(), weights, metrics | is_metrics
