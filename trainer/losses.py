"""Pure tensor losses, aggregation and advantage estimators.

Every loss returns `(loss, metrics)` where `loss` is a scalar with grad and `metrics` holds detached
python floats. No module state, no config objects: hyperparameters are plain arguments. Formulas
and the reference each one matches are in docs/trainer.md.

Shape legend:
    B  sequences in the (local) batch
    T  target positions (padded sequence length - 1); position t predicts token t + 1
    V  vocabulary size
    Every `[B, T]` tensor is aligned to targets; `mask` is 1.0 on trained (model-generated) tokens.

Aggregation: a per-token loss `l[B, T]` becomes a scalar in one of four ways (`Aggregation`), over
the *global* batch when a `Normaliser` carries the data-parallel counts (see `aggregate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "Aggregation",
    "KLEstimator",
    "Normaliser",
    "advantage_metrics",
    "aggregate",
    "bradley_terry_loss",
    "check_aggregation",
    "check_kl_estimator",
    "cispo_loss",
    "diffusion_dpo_loss",
    "dpo_loss",
    "gae",
    "group_advantages",
    "gspo_loss",
    "kl_estimate",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kto_loss",
    "masked_mean",
    "masked_whiten",
    "mse_loss",
    "nll_loss",
    "orpo_loss",
    "pair_mean",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "process_reward_loss",
    "remax_advantages",
    "returns_to_go",
    "reverse_kl_distill_loss",
    "reward_weighted_flow_loss",
    "rloo_advantages",
    "sequence_logprobs",
    "simpo_loss",
    "token_logprobs",
    "value_loss",
]

Metrics = dict[str, float]
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                      "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
LOG_RATIO_CLAMP = 20.0
"""|log pi - log pi_old| is clamped here before exp (verl): a ratio never exceeds e^20."""
GSPO_LOG_RATIO_MAX = 10.0
"""GSPO's sequence log-ratio is clamped from above here before exp (verl)."""


# ----------------------------------------------------------------------------- aggregation


@dataclass(frozen=True, slots=True)
class Normaliser:
    """Denominators of a loss over the whole (data-parallel) batch of one role.

    A rank holding some rows computes `sum over its rows / global count * dp_size`; FSDP averages
    gradients over the `dp_size` ranks, so the update equals one on the whole batch.
    """

    num_tokens: float
    """Loss-masked tokens in the global batch."""
    num_sequences: float
    """Sequences with at least one loss-masked token in the global batch."""
    dp_size: int = 1
    """Ranks whose gradients FSDP averages (1: one process, or a role computing the whole batch)."""
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Sums a tensor over those ranks (batch statistics such as whitening); None: nothing to sum."""

    @classmethod
    def of(cls, mask: torch.Tensor) -> Normaliser:
        """The counts of `mask` [B, T] alone (one process)."""
        return cls(num_tokens=float(mask.sum().item()),
                   num_sequences=float((mask.sum(-1) > 0).sum().item()))

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """`x` summed over the data-parallel ranks."""
        return x if self.all_reduce is None else self.all_reduce(x)


def check_aggregation(how: str, max_tokens: int | None = None) -> None:
    """Raise ValueError unless `how` is a known mode with what it needs."""
    if how not in AGGREGATIONS:
        raise ValueError(f"aggregation={how!r} is unknown; use one of {list(AGGREGATIONS)}")
    if how == "seq-mean-token-sum-norm" and (max_tokens is None or max_tokens < 1):
        raise ValueError("aggregation='seq-mean-token-sum-norm' needs max_tokens >= 1: the "
                         f"completion budget (constant length), got {max_tokens!r}")


def _divide(total: torch.Tensor, count: float | torch.Tensor) -> torch.Tensor:
    if isinstance(count, torch.Tensor):
        return total / count.to(total.dtype).clamp(min=1.0)
    return total / max(float(count), 1.0)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: Aggregation, *,
              max_tokens: int | None = None, norm: Normaliser | None = None) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar; N = sequences with a masked token, n_i = masked
    tokens of sequence i, L = `max_tokens` (all counts global when `norm` is given).

    token-mean:              sum_i,t l / sum_i n_i                 (DAPO, TRL `dapo`/`bnpo`)
    seq-mean-token-mean:     1/N sum_i (sum_t l / n_i)             (GRPO)
    seq-mean-token-sum:      1/N sum_i sum_t l                     (verl)
    seq-mean-token-sum-norm: 1/N sum_i sum_t l / L                 (Dr. GRPO, TRL `dr_grpo`)
    """
    check_aggregation(how, max_tokens)
    masked = per_token * mask  # [B, T]
    row_tokens = mask.sum(-1)  # [B]
    dp = 1 if norm is None else norm.dp_size
    if how == "token-mean":
        count: float | torch.Tensor = row_tokens.sum() if norm is None else norm.num_tokens
        return _divide(masked.sum(), count) * dp
    rows = masked.sum(-1)  # [B]
    if how == "seq-mean-token-mean":
        rows = rows / row_tokens.clamp(min=1.0)
    elif how == "seq-mean-token-sum-norm":
        assert max_tokens is not None
        rows = rows / float(max_tokens)
    count = (row_tokens > 0).sum() if norm is None else norm.num_sequences
    return _divide(rows.sum(), count) * dp


# ----------------------------------------------------------------------------- basics


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                   temperatures: torch.Tensor | None = None) -> torch.Tensor:
    """log p(target) under softmax(logits / T_i): logits [B, T, V], targets [B, T], temperatures
    [B] (None: 1) -> [B, T] in float32 (float64 stays float64)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperatures is not None:
        x = x / temperatures.to(x.dtype).view(-1, 1, 1)
    logp = torch.log_softmax(x, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_metrics(logits: torch.Tensor, mask: torch.Tensor,
                    temperatures: torch.Tensor | None = None) -> Metrics:
    """Mean entropy (nats) of the policy's next-token distribution over the tokens `mask` marks,
    each row at its sampling temperature (verl's `actor/entropy`): logits [B, T, V], mask [B, T].
    No gradient; one row at a time, so at most one [T, V] copy is held, and one device sync in all.
    Empty for an empty mask."""
    if logits.shape[0] == 0:
        return {}
    with torch.no_grad():
        sums = []
        for row in range(logits.shape[0]):
            x = logits[row].to(torch.promote_types(logits.dtype, torch.float32))
            if temperatures is not None:
                x = x / temperatures[row].to(x.dtype)
            logp = torch.log_softmax(x, dim=-1)
            per_token = -(logp.exp() * logp).sum(-1)  # [T]
            sums.append((per_token * mask[row].to(per_token.dtype)).sum())
        total = torch.stack(sums).sum()
        total, count = torch.stack([total, mask.sum().to(total)]).tolist()
    return {"entropy": total / count} if count else {}


def advantage_metrics(advantages: torch.Tensor, mask: torch.Tensor) -> Metrics:
    """Mean, max and min of the advantages (`[B]` per sequence, or `[B, T]` per token, read where
    `mask` is 1), as verl reports them; empty for an empty batch."""
    values = advantages[mask > 0] if advantages.dim() == 2 else advantages  # [N]
    if values.numel() == 0:
        return {}
    values = values.detach().float()
    return {"advantages_mean": values.mean().item(), "advantages_max": values.max().item(),
            "advantages_min": values.min().item()}


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is 1 (whole tensor, or along `dim`)."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def _masked_extremes(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    values = x.detach()[mask > 0]
    if values.numel() == 0:
        return 0.0, 0.0
    return float(values.min().item()), float(values.max().item())


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, *, eps: float = 1e-8,
                  norm: Normaliser | None = None) -> torch.Tensor:
    """(x - mean) / std over the masked positions of the global batch (unbiased variance, as
    verl); zero outside the mask. With `norm`, the statistics are summed over its ranks."""
    reduce = norm.sum if norm is not None else (lambda t: t)
    first = reduce(torch.stack([(x * mask).sum(), mask.sum().to(x.dtype)]))
    count = first[1]
    mean = first[0] / count.clamp(min=1.0)
    sq = reduce(((x - mean) ** 2 * mask).sum())
    var = sq / (count - 1.0).clamp(min=1.0)  # unbiased; one token: var 0, output 0
    return (x - mean) * torch.rsqrt(var + eps) * mask


def sequence_logprobs(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of token logprobs per sequence: [B, T] -> [B]."""
    return (logp * mask).sum(-1)


# ----------------------------------------------------------------------------- advantages


def _group_sums(values: torch.Tensor, group_index: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
        0, group_index, values)


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *,
                     scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: reward minus its group mean, divided by (the group's unbiased std + eps)
    if asked. A group of one has no baseline: advantage 0. rewards [B], group_index [B] -> [B]."""
    num_groups = int(group_index.max().item()) + 1
    counts = _group_sums(torch.ones_like(rewards), group_index, num_groups)
    mean = (_group_sums(rewards, group_index, num_groups) / counts)[group_index]
    centred = rewards - mean
    if not scale_by_std:
        return centred
    sq = _group_sums(centred ** 2, group_index, num_groups)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1.0))[group_index]
    return centred / (std + eps)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i - mean of the other rewards in its group. [B] -> [B].

    A group of one sample has no baseline: its advantage is 0.
    """
    num_groups = int(group_index.max().item()) + 1
    counts = _group_sums(torch.ones_like(rewards), group_index, num_groups)
    sums = _group_sums(rewards, group_index, num_groups)
    n = counts[group_index]
    baseline = (sums[group_index] - rewards) / (n - 1).clamp(min=1.0)
    return torch.where(n > 1, rewards - baseline, torch.zeros_like(rewards))


def remax_advantages(rewards: torch.Tensor, group_index: torch.Tensor,
                     greedy: torch.Tensor) -> torch.Tensor:
    """ReMax: r_i - r_greedy(group of i), the reward of the group's greedy (T = 0) response as
    the baseline. Greedy rows and groups without one get advantage 0. [B] -> [B]."""
    num_groups = int(group_index.max().item()) + 1
    g = greedy.to(rewards.dtype)
    counts = _group_sums(g, group_index, num_groups)  # greedy rows per group
    baseline = _group_sums(rewards * g, group_index, num_groups) / counts.clamp(min=1.0)
    has = (counts > 0)[group_index] & ~greedy
    return torch.where(has, rewards - baseline[group_index], torch.zeros_like(rewards))


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted sum of future rewards over masked positions: [B, T] -> [B, T].

    Unmasked positions (observations between turns) are skipped, not reset: earlier turns still
    see the final reward.
    """
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(mask[:, t] > 0, token_rewards[:, t] + gamma * running, running)
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


# ----------------------------------------------------------------------------- KL estimators


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 estimator of KL(pi || ref) per sampled token: log pi - log ref. [B, T]."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 estimator: (log pi - log ref)^2 / 2 >= 0, low variance, biased. [B, T]."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator (Schulman): exp(d) - d - 1 with d = ref - pi, >= 0, unbiased. [B, T].

    As verl: d is clamped to [-20, 20] and the estimate to <= 10 (no overflow on outliers).
    """
    delta = torch.clamp(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(delta) - delta - 1.0, max=10.0)


def check_kl_estimator(estimator: str) -> None:
    """Raise ValueError unless `estimator` is `k1`, `k2` or `k3`."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={estimator!r} is unknown; use one of {list(KL_ESTIMATORS)}")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token KL(pi || ref) by the named estimator (`k1`, `k2`, `k3`). [B, T]."""
    check_kl_estimator(estimator)
    return {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}[estimator](logp, ref_logp)


# ----------------------------------------------------------------------------- policy losses


def _weighted(per_token: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return per_token if weights is None else per_token * weights.detach()


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                  dual_clip: float | None = 3.0, weights: torch.Tensor | None = None,
                  aggregation: Aggregation = "token-mean", max_tokens: int | None = None,
                  norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate with dual clip (verl `vanilla`), r = exp(clamp(logp - old, +-20)):

        l = max(-A r, -A clip(r, 1 - lo, 1 + hi));  A < 0: l = min(l, -A c)   (c = `dual_clip`)

    times the detached off-policy `weights` ([B, T] or [B, 1]) when given, then aggregated.
    logp, old_logp, mask: [B, T]; advantages: [B, T] or [B, 1] (broadcast over tokens).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip={dual_clip} must be > 1 (or None to disable)")
    log_ratio = torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    metrics: Metrics = {"clip_frac": masked_mean((clipped > unclipped).float(), mask).item()}
    if dual_clip is not None:
        bound = -advantages * dual_clip
        negative = (advantages < 0).expand_as(per_token)
        metrics["dual_clip_frac"] = masked_mean(((per_token > bound) & negative).float(),
                                                mask).item()
        per_token = torch.where(negative, torch.minimum(per_token, bound), per_token)
    loss = aggregate(_weighted(per_token, weights), mask, aggregation, max_tokens=max_tokens,
                     norm=norm)
    low, high = _masked_extremes(ratio, mask)
    metrics.update(pg_loss=loss.item(), ratio_mean=masked_mean(ratio.detach(), mask).item(),
                   ratio_min=low, ratio_max=high,
                   approx_kl=masked_mean(-log_ratio.detach(), mask).item())
    return loss, metrics


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_low: float = 3e-4, clip_high: float = 4e-4,
              weights: torch.Tensor | None = None,
              aggregation: Aggregation = "seq-mean-token-mean", max_tokens: int | None = None,
              norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """GSPO: one length-normalised ratio per sequence, s_i = exp(mean_t(logp - old)), clipped.

    Written per token as GSPO-token (verl `gspo`): s_it = sg(s_i) * pi_t / sg(pi_t) has the value
    s_i and the gradient of s_i under seq-mean-token-mean, and fully masked rows drop out.
    logp, old_logp, mask: [B, T]; advantages: [B].
    """
    seq_log_ratio = masked_mean(logp - old_logp, mask, dim=-1)  # [B]
    log_ratio = logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [B, T]
    ratio = torch.exp(torch.clamp(log_ratio, max=GSPO_LOG_RATIO_MAX))
    adv = advantages.unsqueeze(-1)  # [B, 1]
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(_weighted(per_token, weights), mask, aggregation, max_tokens=max_tokens,
                     norm=norm)
    rows = (mask.sum(-1) > 0).float()  # [B]
    seq_ratio = torch.exp(seq_log_ratio.detach())
    seq_clipped = ((clipped > unclipped) & (mask > 0)).any(-1).float()  # [B]
    return loss, {"pg_loss": loss.item(), "clip_frac": masked_mean(seq_clipped, rows).item(),
                  "ratio_mean": masked_mean(seq_ratio, rows).item()}


def policy_gradient_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                         weights: torch.Tensor | None = None,
                         aggregation: Aggregation = "token-mean", max_tokens: int | None = None,
                         norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """Vanilla REINFORCE: -A * log pi, aggregated. logp, mask: [B, T]; advantages [B, T] or [B, 1]."""
    loss = aggregate(_weighted(-advantages * logp, weights), mask, aggregation,
                     max_tokens=max_tokens, norm=norm)
    return loss, {"pg_loss": loss.item()}


def reverse_kl_distill_loss(logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, *,
                            aggregation: Aggregation = "token-mean", max_tokens: int | None = None,
                            norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """On-policy distillation: per-token reverse KL(student || teacher) on the student's own samples.

    Score-function form: gradient of E_s[log s - log t] is E_s[(log s - log t) grad log s], so the
    per-token loss is sg(log s - log t) * log s, aggregated. logp, teacher_logp, mask: [B, T].
    """
    reverse_kl = (logp - teacher_logp).detach()  # [B, T]
    loss = aggregate(reverse_kl * logp, mask, aggregation, max_tokens=max_tokens, norm=norm)
    return loss, {"reverse_kl": masked_mean(reverse_kl, mask).item(), "distill_loss": loss.item()}


# ----------------------------------------------------------------------------- other losses


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               old_values: torch.Tensor | None = None, clip: float | None = None,
               norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """0.5 * (V - R)^2, token mean, optionally PPO-clipped around `old_values`. [B, T]."""
    err = (values - returns) ** 2
    if old_values is not None and clip is not None:
        clipped_v = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (clipped_v - returns) ** 2)
    loss = 0.5 * aggregate(err, mask, "token-mean", norm=norm)
    return loss, {"value_loss": loss.item(), "value_mean": masked_mean(values.detach(), mask).item()}


def mse_loss(pred: torch.Tensor, target: torch.Tensor, *,
             norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """Mean squared error over the sequences of the global batch (with `norm`: the count is
    summed over its ranks, as `pair_mean`): pred, target [B]."""
    loss = pair_mean((pred - target.to(pred.dtype)) ** 2, norm)
    return loss, {"mse": loss.item()}


def nll_loss(logp: torch.Tensor, mask: torch.Tensor, *, aggregation: Aggregation = "token-mean",
             max_tokens: int | None = None,
             norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """Supervised fine-tuning: negative log-likelihood of masked tokens, aggregated. [B, T]."""
    loss = aggregate(-logp, mask, aggregation, max_tokens=max_tokens, norm=norm)
    nll = -masked_mean(logp.detach(), mask)
    return loss, {"nll": nll.item(), "ppl": float(torch.exp(nll).item())}


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
             ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, *,
             beta: float = 0.1, label_smoothing: float = 0.0,
             norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """Sigmoid DPO: -log sigma(beta * ((pi_c - ref_c) - (pi_r - ref_r))), mean over the pairs of
    the global batch (with `norm`: pair counts summed over its ranks). Inputs: sequence logps [P]."""
    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))  # [P]
    losses = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)
    if norm is None:
        loss = losses.mean()
    else:
        pairs = norm.sum(torch.tensor([float(losses.numel())], dtype=torch.float64,
                                      device=losses.device))
        loss = _divide(losses.sum(), pairs[0]) * norm.dp_size
    return loss, {"dpo_loss": loss.item(), "reward_margin": margin.detach().mean().item(),
                  "reward_accuracy": (margin > 0).float().mean().item()}


def pair_mean(losses: torch.Tensor, norm: Normaliser | None = None) -> torch.Tensor:
    """Mean of per-pair (or per-sequence) losses [P] over the global batch: with `norm`, the
    count is summed over its ranks (FSDP then averages gradients over them)."""
    if norm is None:
        return losses.mean() if losses.numel() else losses.sum()
    count = norm.sum(torch.tensor([float(losses.numel())], dtype=torch.float64,
                                  device=losses.device))
    return _divide(losses.sum(), count[0]) * norm.dp_size


# ----------------------------------------------------------------------------- more policy losses


def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
               mask: torch.Tensor, *, ratio_cap: float = 5.0, ratio_floor: float = 0.0,
               aggregation: Aggregation = "token-mean", max_tokens: int | None = None,
               norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1): REINFORCE with a clipped, detached importance weight, so no token
    loses its gradient (TRL `loss_type="cispo"`, `epsilon_high` = `ratio_cap`):

        l_t = -sg(clip(r_t, floor, cap)) * A * log pi_t,   r_t = exp(clamp(log pi_t - log old_t))

    logp, old_logp, mask: [B, T]; advantages [B, T] or [B, 1]."""
    if not ratio_cap > ratio_floor >= 0.0:
        raise ValueError(f"ratio_cap={ratio_cap} must exceed ratio_floor={ratio_floor} >= 0")
    ratio = torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).detach()
    weight = torch.clamp(ratio, ratio_floor, ratio_cap)  # [B, T]
    loss = aggregate(-weight * advantages * logp, mask, aggregation, max_tokens=max_tokens,
                     norm=norm)
    return loss, {"pg_loss": loss.item(),
                  "clip_frac": masked_mean((weight != ratio).float(), mask).item(),
                  "ratio_mean": masked_mean(ratio, mask).item()}


# ----------------------------------------------------------------------------- preferences


def kto_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor, *,
             beta: float = 0.1, desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
             norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """KTO (Ethayarajh et al.; TRL `KTOTrainer`), with rho_i = log pi(y_i|x_i) - log ref(y_i|x_i):

        z0 = sg(max(0, mean_i rho_i))                     (reference point, over the global batch)
        l_i = w_d (1 - sigma(beta (rho_i - z0)))          desirable y_i
        l_i = w_u (1 - sigma(beta (z0 - rho_i)))          undesirable y_i
        L = mean_i l_i

    TRL estimates z0 on mismatched (x, y') pairs; we use the batch's own samples (no extra
    forward pass), as KTO's paper allows for a batch-level estimate. Inputs: sequence logps [B],
    `desirable` [B] bool."""
    rho = policy_logps - ref_logps  # [B]
    stats = torch.stack([rho.detach().sum(), torch.tensor(float(rho.numel()), dtype=rho.dtype,
                                                          device=rho.device)])
    if norm is not None:
        stats = norm.sum(stats)
    z0 = torch.clamp(stats[0] / stats[1].clamp(min=1.0), min=0.0)
    good = desirable_weight * (1 - torch.sigmoid(beta * (rho - z0)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - rho)))
    loss = pair_mean(torch.where(desirable, good, bad), norm)
    return loss, {"kto_loss": loss.item(), "kl_ref_point": float(z0.item()),
                  "desirable_frac": desirable.float().mean().item()}


def simpo_loss(chosen_avg: torch.Tensor, rejected_avg: torch.Tensor, *, beta: float = 2.0,
               gamma: float = 1.0, norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """SimPO (Meng et al.; TRL `CPOTrainer(loss_type="simpo")`, gamma = TRL's `simpo_gamma`):

        L = mean_pairs -log sigma(beta * (avg log pi(y_c) - avg log pi(y_r)) - gamma)

    with length-averaged sequence logprobs (no reference model). Inputs [P]."""
    margin = beta * (chosen_avg - rejected_avg) - gamma  # [P]
    loss = pair_mean(-F.logsigmoid(margin), norm)
    return loss, {"simpo_loss": loss.item(), "reward_margin": margin.detach().mean().item()
                  if margin.numel() else 0.0,
                  "reward_accuracy": (margin > 0).float().mean().item() if margin.numel() else 0.0}


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, accurate at both ends (as TRL's `log1mexp`)."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)),
                       torch.log1p(-torch.exp(x)))


def orpo_loss(chosen_avg: torch.Tensor, rejected_avg: torch.Tensor, chosen_logp: torch.Tensor,
              chosen_mask: torch.Tensor, *, lam: float = 0.1,
              norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """ORPO (Hong et al.) as TRL's `ORPOTrainer` computes it, with a(y) = avg log pi(y):

        log odds(y) = a(y) - log(1 - e^a(y))
        L = sum_c,t -log pi(y_ct) / sum_c n_c - lam * mean_pairs log sigma(log odds(y_c) - log odds(y_r))

    The NLL is one token mean over every chosen response of the (global) batch, not a mean of
    per-response means. chosen_avg, rejected_avg: [P]; chosen_logp, chosen_mask: [P, T] (the
    chosen rows' token logprobs and the tokens their NLL counts)."""
    log_odds = (chosen_avg - rejected_avg) - (_log1mexp(chosen_avg) - _log1mexp(rejected_avg))
    ratio = F.logsigmoid(log_odds)  # [P]
    nll_sum = -(chosen_logp * chosen_mask).sum()
    count = chosen_mask.sum().to(torch.float64).reshape(1)
    dp = 1 if norm is None else norm.dp_size
    if norm is not None:
        count = norm.sum(count)
    nll = _divide(nll_sum, count[0]) * dp
    loss = nll - lam * pair_mean(ratio, norm)
    return loss, {"orpo_loss": loss.item(),
                  "log_odds_ratio": log_odds.detach().mean().item() if log_odds.numel() else 0.0,
                  "nll_chosen": nll.item()}


def bradley_terry_loss(score_chosen: torch.Tensor, score_rejected: torch.Tensor, *,
                       center_coef: float = 0.0,
                       norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """Bradley-Terry reward model (TRL `RewardTrainer`, `center_rewards_coefficient`):

        L = mean_pairs [ -log sigma(s_c - s_r) + c * (s_c + s_r)^2 ]

    Inputs: scalar scores [P]."""
    diff = score_chosen - score_rejected  # [P]
    per_pair = -F.logsigmoid(diff) + center_coef * (score_chosen + score_rejected) ** 2
    loss = pair_mean(per_pair, norm)
    return loss, {"bt_loss": loss.item(),
                  "accuracy": (diff > 0).float().mean().item() if diff.numel() else 0.0}


def process_reward_loss(step_logits: torch.Tensor, step_labels: torch.Tensor, *,
                        norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """Process reward model: binary cross-entropy of each step's score against its label in
    [0, 1] (soft Monte-Carlo labels allowed; TRL `PRMTrainer` uses hard ones):

        L = mean_steps -(y log sigma(s) + (1 - y) log(1 - sigma(s)))

    step_logits, step_labels: [S] (one entry per step of every sequence)."""
    per_step = F.binary_cross_entropy_with_logits(step_logits, step_labels.to(step_logits.dtype),
                                                  reduction="none")
    loss = pair_mean(per_step, norm)
    hits = ((step_logits > 0) == (step_labels > 0.5)).float()
    return loss, {"prm_loss": loss.item(),
                  "step_accuracy": hits.mean().item() if hits.numel() else 0.0}


# ----------------------------------------------------------------------------- flow matching


def reward_weighted_flow_loss(flow_error: torch.Tensor, rewards: torch.Tensor, *,
                              temperature: float = 1.0) -> tuple[torch.Tensor, Metrics]:
    """Reward-weighted conditional flow matching (online RW-CFM, Fan et al. 2025):

        w_i = exp((r_i - max_j r_j) / tau) / sum_j exp((r_j - max_j r_j) / tau)
        L = sum_i w_i * mean_k || v(x_t^ik, t_ik) - (x1_i - x0_ik) ||^2

    flow_error [B, K]: the squared velocity error of sample i under noise draw k; rewards [B].
    The weights are normalised over the rows this rank holds; data-parallel ranks then average
    their losses (FSDP's gradient mean)."""
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    weights = torch.softmax(rewards.to(flow_error.dtype) / temperature, dim=0).detach()  # [B]
    per_sample = flow_error.mean(-1)  # [B]
    loss = (weights * per_sample).sum()
    entropy = -(weights * torch.log(weights.clamp(min=1e-30))).sum()
    return loss, {"rwfm_loss": loss.item(), "flow_error": per_sample.detach().mean().item(),
                  "weight_ess": float(torch.exp(entropy).item())}


def diffusion_dpo_loss(policy_chosen: torch.Tensor, ref_chosen: torch.Tensor,
                       policy_rejected: torch.Tensor, ref_rejected: torch.Tensor, *,
                       beta: float = 1.0,
                       norm: Normaliser | None = None) -> tuple[torch.Tensor, Metrics]:
    """Diffusion-DPO (Wallace et al. 2024) in flow-matching form: e = mean_k squared velocity
    error of a sample under shared noise (x0, t) for policy and reference,

        L = mean_pairs -log sigma(-beta * ((e_c - e_ref_c) - (e_r - e_ref_r)))

    Inputs [P]: lowering the chosen sample's error relative to the reference raises sigma."""
    margin = -beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))  # [P]
    loss = pair_mean(-F.logsigmoid(margin), norm)
    return loss, {"diffusion_dpo_loss": loss.item(),
                  "reward_margin": margin.detach().mean().item() if margin.numel() else 0.0,
                  "reward_accuracy": (margin > 0).float().mean().item()
                  if margin.numel() else 0.0}
