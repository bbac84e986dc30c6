"""Pure tensor losses and advantage estimators.

Every loss returns `(loss, metrics)` where `loss` is a scalar with grad and `metrics` holds detached
python floats. No module state, no config objects: hyperparameters are plain arguments.

Shape legend:
    B  sequences in the (local) batch
    T  target positions (padded sequence length - 1); position t predicts token t + 1
    V  vocabulary size
    Every `[B, T]` tensor is aligned to targets; `mask` is 1.0 on trained (model-generated) tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "Aggregation",
    "aggregate",
    "dpo_loss",
    "gae",
    "group_advantages",
    "gspo_loss",
    "kl_k1",
    "kl_k3",
    "masked_mean",
    "masked_whiten",
    "mse_loss",
    "nll_loss",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "returns_to_go",
    "reverse_kl_distill_loss",
    "rloo_advantages",
    "sequence_logprobs",
    "token_logprobs",
    "value_loss",
]

Metrics = dict[str, float]
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits [B, T, V], targets [B, T] -> [B, T] (float32)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is 1 (whole tensor, or along `dim`)."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked positions; zero outside the mask."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def sequence_logprobs(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of token logprobs per sequence: [B, T] -> [B]."""
    return (logp * mask).sum(-1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: Aggregation,
              max_tokens: int | None = None) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    token-mean: mean over all masked tokens (DAPO); seq-mean-token-mean: mean per sequence then over
    sequences (GRPO); seq-mean-token-sum-norm: token sum / a constant length, mean over sequences
    (Dr. GRPO: no length bias). `max_tokens` defaults to T.
    """
    if how == "token-mean":
        return masked_mean(per_token, mask)
    if how == "seq-mean-token-mean":
        return masked_mean(per_token, mask, dim=-1).mean()
    norm = float(max_tokens or per_token.shape[-1])
    return ((per_token * mask).sum(-1) / norm).mean()


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *,
                     scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: reward minus its group mean, divided by the group std (unbiased) if asked.

    rewards [B], group_index [B] (int ids 0..G-1) -> [B].
    """
    num_groups = int(group_index.max().item()) + 1
    counts = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index,
                                                                     torch.ones_like(rewards))
    sums = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, rewards)
    mean = (sums / counts)[group_index]
    centred = rewards - mean
    if not scale_by_std:
        return centred
    sq = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, centred ** 2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1.0))[group_index]
    return centred / (std + eps)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i - mean of the other rewards in its group. [B] -> [B].

    A group of one sample has no baseline: its advantage is 0.
    """
    num_groups = int(group_index.max().item()) + 1
    counts = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index,
                                                                     torch.ones_like(rewards))
    sums = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group_index, rewards)
    n = counts[group_index]
    baseline = (sums[group_index] - rewards) / (n - 1).clamp(min=1.0)
    return torch.where(n > 1, rewards - baseline, torch.zeros_like(rewards))


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 estimator of KL(pi || ref) per sampled token: log pi - log ref. [B, T]."""
    return logp - ref_logp


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator (Schulman): exp(ref - pi) - (ref - pi) - 1 >= 0, unbiased, low variance. [B, T]."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted sum of future rewards on masked positions: [B, T] -> [B, T]."""
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running * mask[:, t]
        out[:, t] = running
    return out * mask


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *,
        gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over masked positions (unmasked ones are skipped).

    token_rewards, values, mask: [B, T] -> (advantages [B, T], returns [B, T]); the value after the
    last masked position is 0 (episode end).
    """
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        advantages[:, t] = adv_t * m
        next_value = torch.where(m > 0, values[:, t], next_value)
        next_adv = torch.where(m > 0, adv_t, next_adv)
    return advantages, (advantages + values) * mask


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                  aggregation: Aggregation = "token-mean") -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate: -min(r A, clip(r, 1-lo, 1+hi) A), r = exp(logp - old_logp).

    logp, old_logp, mask: [B, T]; advantages: [B, T] or [B, 1] (broadcast over tokens).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss = aggregate(per_token, mask, aggregation)
    clip_frac = masked_mean((clipped < unclipped).float(), mask)
    return loss, {"pg_loss": loss.item(), "clip_frac": clip_frac.item(),
                  "ratio_mean": masked_mean(ratio.detach(), mask).item()}


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_low: float = 3e-4,
              clip_high: float = 4e-4) -> tuple[torch.Tensor, Metrics]:
    """GSPO: one length-normalised importance ratio per sequence, clipped at sequence level.

    s_i = exp(mean_t(logp - old_logp)); logp, old_logp, mask: [B, T]; advantages: [B].
    """
    log_ratio = masked_mean(logp - old_logp, mask, dim=-1)  # [B]
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped).mean()
    clip_frac = (clipped < unclipped).float().mean()
    return loss, {"pg_loss": loss.item(), "clip_frac": clip_frac.item(),
                  "ratio_mean": ratio.detach().mean().item()}


def policy_gradient_loss(logp: torch.Tensor, advantages: torch.Tensor,
                         mask: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Vanilla REINFORCE: -A * log pi, token mean. logp, mask: [B, T]; advantages [B, T] or [B, 1]."""
    loss = masked_mean(-advantages * logp, mask)
    return loss, {"pg_loss": loss.item()}


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               old_values: torch.Tensor | None = None,
               clip: float | None = None) -> tuple[torch.Tensor, Metrics]:
    """0.5 * (V - R)^2 over masked tokens, optionally PPO-clipped around `old_values`. [B, T]."""
    err = (values - returns) ** 2
    if old_values is not None and clip is not None:
        clipped_v = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (clipped_v - returns) ** 2)
    loss = 0.5 * masked_mean(err, mask)
    return loss, {"value_loss": loss.item(), "value_mean": masked_mean(values.detach(), mask).item()}


def mse_loss(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Mean squared error: pred, target [B]."""
    loss = F.mse_loss(pred, target)
    return loss, {"mse": loss.item()}


def nll_loss(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """Supervised fine-tuning: mean negative log-likelihood of masked tokens. [B, T]."""
    loss = -masked_mean(logp, mask)
    return loss, {"nll": loss.item(), "ppl": float(torch.exp(loss.detach()).item())}


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
             ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, *,
             beta: float = 0.1, label_smoothing: float = 0.0) -> tuple[torch.Tensor, Metrics]:
    """Sigmoid DPO: -log sigma(beta * ((pi_c - ref_c) - (pi_r - ref_r))). Inputs: sequence logps [P]."""
    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))  # [P]
    losses = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)
    loss = losses.mean()
    return loss, {"dpo_loss": loss.item(), "reward_margin": margin.detach().mean().item(),
                  "reward_accuracy": (margin > 0).float().mean().item()}


def reverse_kl_distill_loss(logp: torch.Tensor, teacher_logp: torch.Tensor,
                            mask: torch.Tensor) -> tuple[torch.Tensor, Metrics]:
    """On-policy distillation: per-token reverse KL(student || teacher) on the student's own samples.

    Score-function form: gradient of E_s[log s - log t] is E_s[(log s - log t) grad log s], so the
    loss is mean(sg(log s - log t) * log s). logp, teacher_logp, mask: [B, T].
    """
    reverse_kl = (logp - teacher_logp).detach()  # [B, T]
    loss = masked_mean(reverse_kl * logp, mask)
    return loss, {"reverse_kl": masked_mean(reverse_kl, mask).item(), "distill_loss": loss.item()}
