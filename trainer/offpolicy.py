"""Off-policy correction: importance weights from the behaviour policy to the trainer's policy.

STACX trains asynchronously: a batch may come from a policy several versions old, sampled by an
inference engine whose numerics differ from the trainer's. Let mu be the behaviour (sampling)
logprobs recorded in the batch and pi_old the trainer's own logprobs before the update. Without a
correction (`none`) PPO clips around mu. With one, PPO clips around pi_old and each token's loss is
multiplied by a detached weight built from rho_t = pi_old(t) / mu(t) (TRL's
`vllm_importance_sampling_mode`, verl's `rollout_is` / `rollout_rs`):

    token-truncate     w_t = min(rho_t, C)
    token-mask         w_t = rho_t if floor <= rho_t <= C else 0
    sequence-truncate  w_i = min(prod_t rho_t, C)
    sequence-mask      w_i = prod_t rho_t if floor <= prod_t rho_t <= C else 0

Log-ratios are clamped to [-20, 20] before exp. Masked tokens keep their place in the loss
denominators (as TRL; verl's rejection sampling removes them). Shape legend in trainer/losses.py.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from stacx.trainer.losses import LOG_RATIO_CLAMP, masked_mean

__all__ = ["OFF_POLICY_MODES", "OffPolicyMode", "check_off_policy", "importance_weights",
           "mismatch_metrics"]

Metrics = dict[str, float]
OffPolicyMode = Literal["none", "token-truncate", "token-mask", "sequence-truncate",
                        "sequence-mask"]
OFF_POLICY_MODES: tuple[str, ...] = get_args(OffPolicyMode)


def check_off_policy(mode: str, cap: float, floor: float) -> None:
    """Raise ValueError unless the mode is known and floor <= 1 <= cap."""
    if mode not in OFF_POLICY_MODES:
        raise ValueError(f"off_policy={mode!r} is unknown; use one of {list(OFF_POLICY_MODES)}")
    if not cap >= 1.0:
        raise ValueError(f"off_policy_cap={cap} must be >= 1 (the largest weight kept)")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"off_policy_floor={floor} must be in [0, 1] (mask modes drop weights "
                         "below it)")


def importance_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                       *, mode: OffPolicyMode, cap: float = 2.0,
                       floor: float = 0.0) -> tuple[torch.Tensor | None, Metrics]:
    """Detached weights [B, T] (token modes) or [B, 1] (sequence modes), None for `none`.

    old_logp, behaviour_logp, mask: [B, T]. Metrics: mean raw ratio, fraction truncated, fraction
    masked (over masked tokens, or over sequences with a masked token).
    """
    check_off_policy(mode, cap, floor)
    if mode == "none":
        return None, {}
    diff = ((old_logp - behaviour_logp) * mask).detach()  # [B, T]
    if mode.startswith("sequence"):
        diff, where = diff.sum(-1, keepdim=True), (mask.sum(-1, keepdim=True) > 0).to(diff.dtype)
    else:
        where = mask
    ratio = torch.exp(torch.clamp(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    none = torch.zeros_like(ratio)
    if mode.endswith("truncate"):
        weights, clipped, dropped = torch.clamp(ratio, max=cap), (ratio > cap).to(ratio.dtype), none
    else:
        keep = (ratio >= floor) & (ratio <= cap)
        weights, clipped, dropped = torch.where(keep, ratio, none), none, (~keep).to(ratio.dtype)
    return weights, {"is_ratio_mean": masked_mean(ratio, where).item(),
                     "is_clip_frac": masked_mean(clipped, where).item(),
                     "is_masked_frac": masked_mean(dropped, where).item()}


def mismatch_metrics(logp: torch.Tensor, behaviour_logp: torch.Tensor,
                     mask: torch.Tensor) -> Metrics:
    """Train-inference gap on masked tokens: KL(mu || pi) by the k3 estimator on mu's samples,
    E[rho - 1 - log rho] with rho = pi / mu, and max |log pi - log mu|. [B, T] inputs."""
    log_rho = torch.clamp((logp - behaviour_logp).detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    kl = torch.exp(log_rho) - 1.0 - log_rho
    gaps = log_rho.abs()[mask > 0]
    return {"mismatch_kl": masked_mean(kl, mask).item(),
            "mismatch_abs_max": float(gaps.max().item()) if gaps.numel() else 0.0}
