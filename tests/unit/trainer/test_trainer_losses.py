"""Losses and advantage estimators against values worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch

from stacx.trainer import losses

T = torch.tensor


def test_ppo_clip_by_hand() -> None:
    # ratios 1.5 (A=+1: clipped to 1.2), 0.5 (A=-1: clipped to 0.8 -> -0.8), 1.0 (A=2: -2)
    logp = torch.log(T([[1.5, 0.5, 1.0]]))
    old = torch.zeros(1, 3)
    adv = T([[1.0, -1.0, 2.0]])
    loss, metrics = losses.ppo_clip_loss(logp, old, adv, torch.ones(1, 3), clip_low=0.2,
                                         clip_high=0.2)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.0) / 3, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(2 / 3)


def test_ppo_clip_gradient_vanishes_outside_the_trust_region() -> None:
    logp = torch.log(T([[1.5]])).requires_grad_()
    loss, _ = losses.ppo_clip_loss(logp, torch.zeros(1, 1), T([[1.0]]), torch.ones(1, 1))
    loss.backward()
    assert logp.grad is not None and logp.grad.item() == 0.0


def test_grpo_group_advantages_by_hand() -> None:
    rewards, groups = T([1.0, 0.0, 1.0, 1.0]), T([0, 0, 1, 1])
    adv = losses.group_advantages(rewards, groups)
    # group 0: mean 0.5, unbiased std sqrt(0.5) -> +-0.5/0.7071; group 1: no spread -> 0
    assert adv.tolist() == pytest.approx([0.70710, -0.70710, 0.0, 0.0], abs=1e-4)
    unscaled = losses.group_advantages(rewards, groups, scale_by_std=False)
    assert unscaled.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_kl_estimators_by_hand() -> None:
    logp, ref = T([math.log(0.5)]), T([math.log(0.25)])
    assert losses.kl_k1(logp, ref).item() == pytest.approx(math.log(2), abs=1e-6)
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + ln 2 - 1
    assert losses.kl_k3(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert losses.kl_k3(ref, ref).item() == 0.0


def test_dpo_sigmoid_by_hand() -> None:
    # margin = 0.5 * ((-1 - -2) - (-3 - -2)) = 1 -> loss = log(1 + e^-1)
    loss, metrics = losses.dpo_loss(T([-1.0]), T([-3.0]), T([-2.0]), T([-2.0]), beta=0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-6)
    assert metrics["reward_accuracy"] == 1.0
    assert metrics["reward_margin"] == pytest.approx(1.0)


def test_gae_by_hand() -> None:
    rewards, values = T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, returns = losses.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.5, 0.4, 0.3], abs=1e-6)  # Monte-Carlo: 1 - V
    adv, returns = losses.gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # d2 = 0.3; d1 = 0.7 - 0.6 = 0.1 -> 0.1 + 0.5 * 0.3; d0 = 0.1 -> 0.1 + 0.5 * 0.25
    assert adv[0].tolist() == pytest.approx([0.225, 0.25, 0.3], abs=1e-6)
    assert returns[0].tolist() == pytest.approx([0.725, 0.85, 1.0], abs=1e-6)


def test_gae_skips_unmasked_positions() -> None:
    adv, _ = losses.gae(T([[0.0, 0.0, 1.0]]), T([[9.0, 0.5, 0.7]]), T([[0.0, 1.0, 1.0]]),
                        gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.0, 0.5, 0.3], abs=1e-6)


def test_rloo_baseline_by_hand() -> None:
    adv = losses.rloo_advantages(T([1.0, 0.0, 0.5, 3.0]), T([0, 0, 0, 1]))
    # baselines: (0 + .5)/2, (1 + .5)/2, (1 + 0)/2; a group of one has no baseline
    assert adv.tolist() == pytest.approx([0.75, -0.75, 0.0, 0.0])


def test_gspo_sequence_ratio_is_clipped() -> None:
    logp, old = T([[0.1, 0.3]]), torch.zeros(1, 2)  # mean log-ratio 0.2 -> ratio e^0.2
    loss, metrics = losses.gspo_loss(logp, old, T([1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-(1 + 4e-4), abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(math.exp(0.2), abs=1e-5)


def test_nll_and_masked_mean() -> None:
    loss, _ = losses.nll_loss(T([[-1.0, -2.0, -7.0]]), T([[1.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx(1.5)


def test_returns_to_go_and_whiten() -> None:
    rtg = losses.returns_to_go(T([[1.0, 0.0, 2.0]]), torch.ones(1, 3), gamma=0.5)
    assert rtg[0].tolist() == pytest.approx([1.5, 1.0, 2.0])
    white = losses.masked_whiten(T([[1.0, 3.0, 100.0]]), T([[1.0, 1.0, 0.0]]))
    # mean 2, unbiased variance ((1 - 2)^2 + (3 - 2)^2) / (2 - 1) = 2 (verl)
    assert white[0].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0], abs=1e-4)


def test_reverse_kl_distill_gradient_is_the_score_function() -> None:
    logp = T([[-1.0, -2.0]]).requires_grad_()
    teacher = T([[-1.5, -1.0]])
    loss, metrics = losses.reverse_kl_distill_loss(logp, teacher, torch.ones(1, 2))
    loss.backward()
    assert metrics["reverse_kl"] == pytest.approx((0.5 - 1.0) / 2)
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.25, -0.5])  # (logp - teacher) / N


def test_aggregations_differ_as_documented() -> None:
    per_token = T([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    mask = T([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert losses.aggregate(per_token, mask, "token-mean").item() == pytest.approx(7 / 5)
    assert losses.aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert losses.aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)
    assert losses.aggregate(per_token, mask, "seq-mean-token-sum-norm",
                            max_tokens=8).item() == pytest.approx((4 / 8 + 3 / 8) / 2)


def test_constant_length_ignores_padding() -> None:
    """Dr. GRPO divides by the completion budget, not by the padded width of the batch."""
    per_token = T([[0.0, 2.0, 2.0], [0.0, 1.0, 0.0]])
    mask = T([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    padded = torch.cat([torch.zeros(2, 3), per_token, torch.zeros(2, 5)], dim=1)
    padded_mask = torch.cat([torch.zeros(2, 3), mask, torch.zeros(2, 5)], dim=1)
    for how in losses.AGGREGATIONS:
        a = losses.aggregate(per_token, mask, how, max_tokens=16)  # type: ignore[arg-type]
        b = losses.aggregate(padded, padded_mask, how, max_tokens=16)  # type: ignore[arg-type]
        assert a.item() == pytest.approx(b.item()), how
    assert losses.aggregate(per_token, mask, "seq-mean-token-sum-norm",
                            max_tokens=16).item() == pytest.approx((4 / 16 + 1 / 16) / 2)


def test_fully_masked_rows_are_not_counted() -> None:
    per_token, mask = T([[2.0, 4.0], [9.0, 9.0]]), T([[1.0, 1.0], [0.0, 0.0]])
    assert losses.aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert losses.aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx(6.0)


def test_unknown_aggregation_and_missing_budget_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"aggregation='bogus' is unknown; use one of"):
        losses.aggregate(torch.ones(1, 2), torch.ones(1, 2), "bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs max_tokens >= 1"):
        losses.aggregate(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm")


def test_global_normaliser_splits_the_batch_exactly() -> None:
    """Two shards with their own rows but global counts (x dp_size, FSDP averages) sum to the
    whole-batch loss in every mode."""
    torch.manual_seed(0)
    per_token = torch.randn(5, 6, dtype=torch.float64)
    mask = (torch.rand(5, 6) > 0.4).double()
    mask[2] = 0.0
    whole = losses.Normaliser.of(mask)
    shards = [torch.tensor([0, 3]), torch.tensor([1, 2, 4])]
    for how in losses.AGGREGATIONS:
        full = losses.aggregate(per_token, mask, how, max_tokens=10)  # type: ignore[arg-type]
        norm = losses.Normaliser(num_tokens=whole.num_tokens, num_sequences=whole.num_sequences,
                                 dp_size=2)
        parts = [losses.aggregate(per_token[r], mask[r], how, max_tokens=10,  # type: ignore[arg-type]
                                  norm=norm) for r in shards]
        assert (torch.stack(parts).sum() / 2).item() == pytest.approx(full.item(), abs=1e-12), how


def test_ppo_clamps_the_log_ratio_and_dual_clips() -> None:
    """log-ratio +100 with A < 0: the ratio is capped at e^20 and the dual clip bounds the loss
    at -A * c = 3 (verl); without the dual clip the loss is A * e^20, not A * e^100."""
    logp, old, mask = T([[100.0]]), T([[0.0]]), T([[1.0]])
    loss, metrics = losses.ppo_clip_loss(logp, old, T([[-1.0]]), mask)
    assert loss.item() == pytest.approx(3.0)
    assert metrics["dual_clip_frac"] == 1.0
    loss, _ = losses.ppo_clip_loss(logp, old, T([[-1.0]]), mask, dual_clip=None)
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)
    with pytest.raises(ValueError, match="dual_clip=1.0 must be > 1"):
        losses.ppo_clip_loss(logp, old, T([[-1.0]]), mask, dual_clip=1.0)


def test_gspo_fully_masked_row_adds_nothing() -> None:
    logp, old = T([[0.1, 0.3], [0.0, 0.0]]), torch.zeros(2, 2)
    mask = T([[1.0, 1.0], [0.0, 0.0]])
    loss, metrics = losses.gspo_loss(logp, old, T([1.0, 5.0]), mask)
    assert loss.item() == pytest.approx(-(1 + 4e-4), abs=1e-6)  # the masked row's -A is gone
    assert metrics["pg_loss"] == pytest.approx(loss.item())


def test_k2_and_dispatch() -> None:
    logp, ref = T([math.log(0.5)]), T([math.log(0.25)])
    assert losses.kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    with pytest.raises(ValueError, match="kl_estimator='k9' is unknown"):
        losses.kl_estimate(logp, ref, "k9")  # type: ignore[arg-type]


def test_returns_carry_across_observation_tokens() -> None:
    """A multi-turn row: the final reward reaches the first turn past the masked observation."""
    rtg = losses.returns_to_go(T([[0.0, 0.0, 9.0, 1.0]]), T([[1.0, 0.0, 0.0, 1.0]]))
    assert rtg[0].tolist() == pytest.approx([1.0, 0.0, 0.0, 1.0])


def test_temperature_scales_logits_per_row() -> None:
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 3))
    temps = T([0.5, 2.0]).double()
    got = losses.token_logprobs(logits, targets, temps)
    for i, t in enumerate(temps.tolist()):
        want = torch.log_softmax(logits[i] / t, -1).gather(-1, targets[i].unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(got[i], want, atol=1e-12)
    assert got.dtype == torch.float64


# ----------------------------------------------------------------------------- data-parallel split

D = torch.float64
Call = Callable[[torch.Tensor, 'losses.Normaliser | None'], tuple[torch.Tensor, dict[str, float]]]


def split_ranks(call: Call, shards: list[torch.Tensor]
                ) -> list[tuple[torch.Tensor, dict[str, float]]]:
    """Each shard's (loss, metrics) under a Normaliser whose `all_reduce` adds the other shards'
    k-th reduced tensor, as a data-parallel all-reduce would; dp_size = number of shards."""
    n = len(shards)
    recorded: list[list[torch.Tensor]] = []
    for shard in shards:
        seen: list[torch.Tensor] = []

        def record(t: torch.Tensor, seen: list[torch.Tensor] = seen) -> torch.Tensor:
            seen.append(t.detach().clone())
            return t

        call(shard, losses.Normaliser(0.0, 0.0, dp_size=n, all_reduce=record))
        recorded.append(seen)
    outs = []
    for r, shard in enumerate(shards):
        calls = iter(range(len(recorded[r])))

        def reduce(t: torch.Tensor, r: int = r, calls: Iterator[int] = calls) -> torch.Tensor:
            k = next(calls)
            return t + torch.stack([recorded[o][k] for o in range(n) if o != r]).sum(0)

        outs.append(call(shard, losses.Normaliser(0.0, 0.0, dp_size=n, all_reduce=reduce)))
    return outs


PAIR = torch.tensor([[-1.0, -2.5, -1.2, -1.9], [-3.0, -1.0, -2.0, -0.5], [-2.0, -2.1, -1.0, -1.5],
                     [-2.5, -1.5, -2.2, -1.0], [-0.5, -0.3, -1.1, -0.8]], dtype=D).T  # [P=4, 5]
PAIR_SHARDS = [torch.tensor([0]), torch.tensor([1, 2, 3])]


def pair_losses() -> dict[str, Call]:
    """Every per-pair loss, called on the rows `idx` of PAIR with a normaliser."""
    def kto(i: torch.Tensor, norm: losses.Normaliser | None) -> tuple[torch.Tensor, dict[str, float]]:
        return losses.kto_loss(PAIR[i, 0] + 2.0, PAIR[i, 1], PAIR[i, 2] > -1.5, beta=0.7,
                               desirable_weight=1.5, undesirable_weight=0.5, norm=norm)

    def orpo(i: torch.Tensor, norm: losses.Normaliser | None) -> tuple[torch.Tensor, dict[str, float]]:
        token = PAIR[i, :4]
        mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=D).expand_as(token) * (
            1 + (i.unsqueeze(-1) == 0))  # row 0 counts its tokens twice: counts differ per row
        return losses.orpo_loss(PAIR[i, 0] / 3, PAIR[i, 1] / 3, token, mask, lam=0.5, norm=norm)

    return {
        "dpo": lambda i, norm: losses.dpo_loss(PAIR[i, 0], PAIR[i, 1], PAIR[i, 2], PAIR[i, 3],
                                               beta=0.5, norm=norm),
        "kto": kto,
        "simpo": lambda i, norm: losses.simpo_loss(PAIR[i, 0], PAIR[i, 1], norm=norm),
        "orpo": orpo,
        "bradley_terry": lambda i, norm: losses.bradley_terry_loss(PAIR[i, 0], PAIR[i, 1],
                                                                   center_coef=0.1, norm=norm),
        "process_reward": lambda i, norm: losses.process_reward_loss(
            PAIR[i, 0] + 1.5, torch.sigmoid(PAIR[i, 1] + 1.0), norm=norm),
        "mse": lambda i, norm: losses.mse_loss(PAIR[i, 0], PAIR[i, 1], norm=norm),
        "diffusion_dpo": lambda i, norm: losses.diffusion_dpo_loss(
            PAIR[i, 0], PAIR[i, 1], PAIR[i, 2], PAIR[i, 3], beta=0.5, norm=norm),
    }


@pytest.mark.parametrize("name", list(pair_losses()))
def test_pair_losses_split_over_ranks_equal_the_whole_batch(name: str) -> None:
    """Shards of 1 and 3 pairs with summed counts (and KTO's summed reference point), averaged
    over the two ranks as FSDP does, give the loss of the whole batch."""
    call = pair_losses()[name]
    whole, _ = call(torch.arange(4), None)
    parts = split_ranks(call, PAIR_SHARDS)
    assert whole.dtype == D
    assert (torch.stack([p[0] for p in parts]).sum() / 2).item() == pytest.approx(whole.item(), rel=1e-12)


TOKEN_LOGP = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.5, -0.2, -0.9],
                           [-2.2, -0.4, -1.1, -0.6]], dtype=D)
TOKEN_OLD = torch.tensor([[-1.3, -0.4, -1.0, -0.1], [-0.3, -0.5, -0.9, -0.2],
                          [-2.0, -0.9, -1.1, -0.6]], dtype=D)
TOKEN_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
                          dtype=D)
TOKEN_ADV = torch.tensor([[1.0], [-2.0], [0.5]], dtype=D)


def token_losses() -> dict[str, Call]:
    lp, old, adv, m = TOKEN_LOGP, TOKEN_OLD, TOKEN_ADV, TOKEN_MASK
    return {
        "ppo": lambda i, norm: losses.ppo_clip_loss(lp[i], old[i], adv[i], m[i], norm=norm),
        "gspo": lambda i, norm: losses.gspo_loss(lp[i], old[i], adv[i, 0], m[i], clip_low=0.1,
                                                 clip_high=0.1, norm=norm),
        "cispo": lambda i, norm: losses.cispo_loss(lp[i], old[i], adv[i], m[i], ratio_cap=1.2,
                                                   norm=norm),
        "pg": lambda i, norm: losses.policy_gradient_loss(lp[i], adv[i], m[i], norm=norm),
        "reverse_kl": lambda i, norm: losses.reverse_kl_distill_loss(lp[i], old[i], m[i],
                                                                     norm=norm),
        "nll": lambda i, norm: losses.nll_loss(lp[i], m[i], norm=norm),
        "value": lambda i, norm: losses.value_loss(lp[i], old[i] * 2, m[i], old_values=old[i],
                                                   clip=0.2, norm=norm),
    }


@pytest.mark.parametrize("name", list(token_losses()))
def test_token_losses_split_over_ranks_equal_the_whole_batch(name: str) -> None:
    call = token_losses()[name]
    whole, _ = call(torch.arange(3), None)
    full = losses.Normaliser.of(TOKEN_MASK)
    norm = losses.Normaliser(full.num_tokens, full.num_sequences, dp_size=2)
    parts = [call(r, norm)[0] for r in (torch.tensor([0]), torch.tensor([1, 2]))]
    assert (torch.stack(parts).sum() / 2).item() == pytest.approx(whole.item(), rel=1e-12)


def test_pair_counts_are_summed_exactly_past_float32() -> None:
    """2^24 + 1 pairs on other ranks: the summed count must stay exact (float64), not round."""
    others = float(2 ** 24 + 1)
    norm = losses.Normaliser(0.0, 0.0, dp_size=2, all_reduce=lambda t: t + others)
    pairs = torch.tensor([0.3, 0.5], dtype=D)
    want = pairs.sum().item() / (others + 2) * 2  # 2^24 + 3 is no float32
    assert losses.pair_mean(pairs, norm).item() == pytest.approx(want, rel=1e-13, abs=0)
    dpo, _ = losses.dpo_loss(pairs, -pairs, pairs * 0, pairs * 0, norm=norm)
    dpo_want = -torch.nn.functional.logsigmoid(0.2 * pairs).sum().item() / (others + 2) * 2
    assert dpo.item() == pytest.approx(dpo_want, rel=1e-13, abs=0)
    token = torch.full((1, 2), -1.0, dtype=D)
    orpo, metrics = losses.orpo_loss(pairs[:1] * 0 - 1, pairs[:1] * 0 - 2, token,
                                     torch.ones(1, 2), lam=0.0, norm=norm)
    assert metrics["nll_chosen"] == pytest.approx(2.0 / (others + 2) * 2, rel=1e-13, abs=0)


# ----------------------------------------------------------------------------- metrics and options


def ref_ppo_token(lr: float, a: float, lo: float, hi: float, c: float
                  ) -> tuple[float, bool, bool, float]:
    """verl `vanilla` per token: (loss, clipped, dual-clipped, ratio)."""
    lr = min(max(lr, -20.0), 20.0)
    r = math.exp(lr)
    un, cl = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
    loss = max(un, cl)
    dual = a < 0 and loss > -a * c
    if a < 0:
        loss = min(loss, -a * c)
    return loss, cl > un, dual, r


def test_ppo_metrics_against_a_per_token_reference() -> None:
    lr = [[math.log(1.5), -100.0, 0.1], [math.log(5.0), math.log(0.5), 50.0]]
    adv, mask = [1.0, -1.0], [[1, 1, 1], [1, 1, 0]]
    loss, metrics = losses.ppo_clip_loss(T(lr, dtype=D), torch.zeros(2, 3, dtype=D),
                                         T([[1.0], [-1.0]], dtype=D), T(mask, dtype=D))
    tokens = [(ref_ppo_token(lr[b][t], adv[b], 0.2, 0.2, 3.0), lr[b][t])
              for b in range(2) for t in range(3) if mask[b][t]]
    n = len(tokens)
    assert set(metrics) == {"clip_frac", "dual_clip_frac", "pg_loss", "ratio_mean", "ratio_min",
                            "ratio_max", "approx_kl"}
    assert loss.item() == pytest.approx(sum(t[0][0] for t in tokens) / n, rel=1e-12)
    assert metrics["pg_loss"] == pytest.approx(loss.item())
    assert metrics["clip_frac"] == pytest.approx(sum(t[0][1] for t in tokens) / n)
    assert metrics["dual_clip_frac"] == pytest.approx(sum(t[0][2] for t in tokens) / n)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 5)
    ratios = [t[0][3] for t in tokens]
    assert metrics["ratio_mean"] == pytest.approx(sum(ratios) / n, rel=1e-12)
    assert metrics["ratio_min"] == pytest.approx(math.exp(-20.0), rel=1e-9)  # clamped at -20
    assert metrics["ratio_max"] == pytest.approx(5.0, rel=1e-12)  # the masked e^20 is not seen
    assert metrics["approx_kl"] == pytest.approx(-sum(max(t[1], -20.0) for t in tokens) / n,
                                                 rel=1e-12)


def test_ppo_extremes_of_one_token_and_of_none() -> None:
    one = T([[math.log(2.0), 0.0]], dtype=D)
    _, metrics = losses.ppo_clip_loss(one, torch.zeros(1, 2, dtype=D), T([[1.0]], dtype=D),
                                      T([[1.0, 0.0]], dtype=D))
    assert (metrics["ratio_min"], metrics["ratio_max"]) == pytest.approx((2.0, 2.0))
    _, metrics = losses.ppo_clip_loss(one, torch.zeros(1, 2, dtype=D), T([[1.0]], dtype=D),
                                      torch.zeros(1, 2, dtype=D))
    assert (metrics["ratio_min"], metrics["ratio_max"]) == (0.0, 0.0)


def test_ppo_defaults_dual_clip_options_and_the_bound_itself() -> None:
    lr, old = T([[math.log(0.5), math.log(1.5), math.log(4.0)]], dtype=D), torch.zeros(1, 3, dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    for a in (1.0, -1.0):
        adv = T([[a]], dtype=D)
        got, _ = losses.ppo_clip_loss(lr, old, adv, mask)
        want, _ = losses.ppo_clip_loss(lr, old, adv, mask, clip_low=0.2, clip_high=0.2,
                                       dual_clip=3.0)
        assert got.item() == want.item()
    # a dual clip of 1.5 is allowed (> 1): the ratio-4 token is bounded at -A * 1.5
    loss, _ = losses.ppo_clip_loss(lr[:, 2:], old[:, 2:], T([[-1.0]], dtype=D), mask[:, 2:],
                                   dual_clip=1.5)
    assert loss.item() == pytest.approx(1.5)
    # a token exactly at the bound (ratio = c) is not dual-clipped
    c = float(torch.exp(T(1.0, dtype=D)))
    _, metrics = losses.ppo_clip_loss(T([[1.0]], dtype=D), T([[0.0]], dtype=D),
                                      T([[-1.0]], dtype=D), T([[1.0]], dtype=D), clip_high=5.0,
                                      dual_clip=c)
    assert metrics["dual_clip_frac"] == 0.0


def test_gspo_defaults_weights_and_sequence_clip_fraction() -> None:
    # rows: clipped (ratio e^0.5, A > 0), in band (ratio 1), one token in band, fully masked
    logp = T([[0.5, 0.5], [0.0, 0.0], [0.0, 9.0], [3.0, 3.0]], dtype=D)
    old, adv = torch.zeros(4, 2, dtype=D), T([1.0, 1.0, -1.0, 1.0], dtype=D)
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], dtype=D)
    loss, metrics = losses.gspo_loss(logp, old, adv, mask)
    want, _ = losses.gspo_loss(logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4)
    assert loss.item() == want.item()
    # row 2 (ratio 1, A < 0): -A * 1 = 1; row 0 clipped at 1 + 4e-4; row 1: -1
    assert loss.item() == pytest.approx((-(1 + 4e-4) - 1.0 + 1.0) / 3, rel=1e-12)
    assert set(metrics) == {"pg_loss", "clip_frac", "ratio_mean"}
    assert metrics["clip_frac"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx((math.exp(0.5) + 1 + 1) / 3, rel=1e-12)
    low = losses.gspo_loss(T([[-0.5]], dtype=D), T([[0.0]], dtype=D), T([-1.0], dtype=D),
                           T([[1.0]], dtype=D))[0]
    assert low.item() == pytest.approx(1 - 3e-4, rel=1e-12)  # clipped at 1 - clip_low
    weights = T([[2.0, 2.0], [1.0, 1.0], [0.5, 0.5], [1.0, 1.0]], dtype=D)
    weighted, _ = losses.gspo_loss(logp, old, adv, mask, weights=weights)
    assert weighted.item() == pytest.approx((-2 * (1 + 4e-4) - 1.0 + 0.5) / 3, rel=1e-12)


def test_cispo_defaults_floor_cap_and_metrics() -> None:
    lr = T([[math.log(0.5), math.log(7.0), -100.0, 100.0]], dtype=D)
    old, adv, mask = torch.zeros(1, 4, dtype=D), T([[1.0]], dtype=D), torch.ones(1, 4, dtype=D)
    logp = lr.clone().requires_grad_()
    loss, metrics = losses.cispo_loss(logp, old, adv, mask)
    want, _ = losses.cispo_loss(lr, old, adv, mask, ratio_cap=5.0, ratio_floor=0.0,
                                aggregation="token-mean")
    assert loss.item() == want.item()
    loss.backward()
    assert logp.grad is not None  # weights clip(r, 0, 5): 0.5, 5, e^-20, 5; d/dlogp = -w A / 4
    assert logp.grad[0].tolist() == pytest.approx([-0.5 / 4, -5 / 4, -math.exp(-20) / 4, -5 / 4],
                                                  rel=1e-9)
    assert set(metrics) == {"pg_loss", "clip_frac", "ratio_mean"}
    assert metrics["pg_loss"] == loss.item()
    assert metrics["clip_frac"] == pytest.approx(2 / 4)
    _, three = losses.cispo_loss(lr[:, :3], old[:, :3], adv, mask[:, :3])
    assert three["clip_frac"] == pytest.approx(1 / 3)  # only the ratio 7 is capped
    assert metrics["ratio_mean"] == pytest.approx((0.5 + 7 + math.exp(-20) + math.exp(20)) / 4,
                                                  rel=1e-12)
    floored = losses.cispo_loss(lr[:, :1], old[:, :1], adv, mask[:, :1], ratio_floor=0.8)[0]
    assert floored.item() == pytest.approx(-0.8 * math.log(0.5), rel=1e-12)  # -w A logp
    with pytest.raises(ValueError, match=r"ratio_cap=1.0 must exceed ratio_floor=1.0 >= 0"):
        losses.cispo_loss(lr, old, adv, mask, ratio_cap=1.0, ratio_floor=1.0)


def test_policy_gradient_defaults_budget_and_weights() -> None:
    logp, adv = T([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]], dtype=D), T([[1.0], [-2.0]], dtype=D)
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=D)
    loss, metrics = losses.policy_gradient_loss(logp, adv, mask)
    assert loss.item() == pytest.approx((6.0 - 1.0) / 4)  # token-mean of -A log pi
    assert metrics == {"pg_loss": loss.item()}
    norm_loss, _ = losses.policy_gradient_loss(logp, adv, mask,
                                               aggregation="seq-mean-token-sum-norm",
                                               max_tokens=10)
    assert norm_loss.item() == pytest.approx((6.0 / 10 - 1.0 / 10) / 2)
    weighted, _ = losses.policy_gradient_loss(logp, adv, mask, weights=T([[2.0], [1.0]], dtype=D))
    assert weighted.item() == pytest.approx((12.0 - 1.0) / 4)


def test_reverse_kl_and_nll_metrics() -> None:
    logp, teacher = T([[-1.0, -2.0]], dtype=D), T([[-1.5, -1.0]], dtype=D)
    loss, metrics = losses.reverse_kl_distill_loss(logp, teacher, torch.ones(1, 2, dtype=D))
    assert set(metrics) == {"reverse_kl", "distill_loss"}
    assert metrics["distill_loss"] == loss.item()
    loss, metrics = losses.nll_loss(T([[-1.0, -2.0, -7.0]], dtype=D), T([[1.0, 1.0, 0.0]], dtype=D))
    assert metrics == {"nll": pytest.approx(1.5), "ppl": pytest.approx(math.exp(1.5))}


def test_value_loss_clips_around_the_old_values() -> None:
    """verl: max((V - R)^2, (old + clip(V - old, -c, c) - R)^2) / 2, token mean."""
    values = T([[1.0, 0.0, 0.5, 9.0]], dtype=D)
    old, returns = T([[0.0, 1.0, 0.4, 0.0]], dtype=D), T([[2.0, -1.0, 0.3, 0.0]], dtype=D)
    mask = T([[1.0, 1.0, 1.0, 0.0]], dtype=D)
    loss, metrics = losses.value_loss(values, returns, mask, old_values=old, clip=0.2)
    # token 0: V-R=-1, clipped V 0.2 -> -1.8; token 1: V-R=1, clipped 0.8 -> 1.8; token 2: in band
    want = 0.5 * (1.8 ** 2 + 1.8 ** 2 + 0.2 ** 2) / 3
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics == {"value_loss": loss.item(), "value_mean": pytest.approx(0.5)}
    plain = 0.5 * (1.0 + 1.0 + 0.04) / 3
    for kwargs in ({"old_values": old}, {"clip": 0.2}, {}):
        got, _ = losses.value_loss(values, returns, mask, **kwargs)  # type: ignore[arg-type]
        assert got.item() == pytest.approx(plain, rel=1e-12), kwargs
    # the clipped error is only the larger one: a value moving towards R past the band
    toward, _ = losses.value_loss(T([[1.0]], dtype=D), T([[1.0]], dtype=D), T([[1.0]], dtype=D),
                                  old_values=T([[0.0]], dtype=D), clip=0.5)
    assert toward.item() == pytest.approx(0.5 * 0.25)


def test_mse_loss_by_hand() -> None:
    pred, target = T([1.0, -1.0, 0.5], dtype=D), T([3.0, 0.0, 0.5], dtype=D)
    loss, metrics = losses.mse_loss(pred, target)
    assert loss.item() == pytest.approx((4.0 + 1.0 + 0.0) / 3)
    assert metrics == {"mse": loss.item()}


def test_dpo_defaults_and_zero_margin_accuracy() -> None:
    args = (T([-1.0, -2.0], dtype=D), T([-3.0, -2.0], dtype=D), T([-2.0, -2.0], dtype=D),
            T([-2.0, -2.0], dtype=D))
    loss, metrics = losses.dpo_loss(*args)
    assert loss.item() == losses.dpo_loss(*args, beta=0.1, label_smoothing=0.0)[0].item()
    assert set(metrics) == {"dpo_loss", "reward_margin", "reward_accuracy"}
    assert metrics["dpo_loss"] == loss.item()
    assert metrics["reward_accuracy"] == 0.5  # the second pair's margin is exactly 0


def test_kto_by_hand() -> None:
    rho = T([1.0, 3.0, -1.0], dtype=D)
    desirable = T([True, False, True])
    loss, metrics = losses.kto_loss(rho, torch.zeros(3, dtype=D), desirable)
    z0 = 1.0  # mean rho
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want = ((1 - sig(0.1 * (1 - z0))) + (1 - sig(0.1 * (z0 - 3))) + (1 - sig(0.1 * (-1 - z0)))) / 3
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics == {"kto_loss": loss.item(), "kl_ref_point": pytest.approx(z0),
                       "desirable_frac": pytest.approx(2 / 3)}
    weighted, _ = losses.kto_loss(rho, torch.zeros(3, dtype=D), desirable, beta=0.5,
                                  desirable_weight=2.0, undesirable_weight=3.0)
    want = (2 * (1 - sig(0.5 * (1 - z0))) + 3 * (1 - sig(0.5 * (z0 - 3)))
            + 2 * (1 - sig(0.5 * (-1 - z0)))) / 3
    assert weighted.item() == pytest.approx(want, rel=1e-12)
    _, one = losses.kto_loss(T([0.6], dtype=D), T([0.0], dtype=D), T([True]))
    assert one["kl_ref_point"] == pytest.approx(0.6)  # one sample: z0 is its rho


def test_simpo_defaults_metrics_and_an_empty_batch() -> None:
    chosen, rejected = T([-1.0, -2.0, -1.0], dtype=D), T([-2.0, -1.0, -1.5], dtype=D)
    loss, metrics = losses.simpo_loss(chosen, rejected)
    margins = [2.0 * 1.0 - 1.0, 2.0 * -1.0 - 1.0, 2.0 * 0.5 - 1.0]  # beta 2, gamma 1
    want = sum(math.log1p(math.exp(-m)) for m in margins) / 3
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics == {"simpo_loss": loss.item(), "reward_margin": pytest.approx(sum(margins) / 3),
                       "reward_accuracy": pytest.approx(1 / 3)}  # margins 1, -3, 0 (not > 0)
    _, half = losses.simpo_loss(T([0.0], dtype=D), T([-1.0], dtype=D), gamma=1.5)
    assert half["reward_accuracy"] == 1.0  # margin 0.5 > 0
    empty = T([], dtype=D)
    loss, metrics = losses.simpo_loss(empty, empty)
    assert metrics == {"simpo_loss": 0.0, "reward_margin": 0.0, "reward_accuracy": 0.0}


def test_orpo_default_metrics_and_log1mexp_near_zero() -> None:
    a = -1e-12  # avg logprob near 0: log(1 - e^a) needs expm1 (log1p(-exp(a)) loses digits)
    chosen, rejected = T([a], dtype=D), T([-2.0], dtype=D)
    token, mask = T([[-1.0, -3.0]], dtype=D), T([[1.0, 1.0]], dtype=D)
    loss, metrics = losses.orpo_loss(chosen, rejected, token, mask)
    log_odds = (a - math.log(-math.expm1(a))) - (-2.0 - math.log(-math.expm1(-2.0)))
    nll = 2.0
    want = nll - 0.1 * -math.log1p(math.exp(-log_odds))
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics == {"orpo_loss": loss.item(), "log_odds_ratio": pytest.approx(log_odds,
                                                                                 rel=1e-12),
                       "nll_chosen": pytest.approx(nll)}
    moderate = (T([-0.5], dtype=D), T([-1.0], dtype=D), token, mask)
    assert losses.orpo_loss(*moderate)[0].item() == losses.orpo_loss(*moderate, lam=0.1)[0].item()
    assert losses.orpo_loss(*moderate)[0].item() != losses.orpo_loss(*moderate, lam=1.0)[0].item()
    empty = T([], dtype=D)
    _, metrics = losses.orpo_loss(empty, empty, torch.zeros(0, 2, dtype=D),
                                  torch.zeros(0, 2, dtype=D))
    assert metrics["log_odds_ratio"] == 0.0


def test_bradley_terry_defaults_accuracy_and_empty() -> None:
    chosen, rejected = T([1.0, 0.5, 2.0], dtype=D), T([0.0, 0.5, 1.5], dtype=D)
    loss, metrics = losses.bradley_terry_loss(chosen, rejected)
    want = sum(math.log1p(math.exp(-d)) for d in (1.0, 0.0, 0.5)) / 3  # no centring by default
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics == {"bt_loss": loss.item(), "accuracy": pytest.approx(2 / 3)}  # diff 0 misses
    empty = T([], dtype=D)
    assert losses.bradley_terry_loss(empty, empty)[1]["accuracy"] == 0.0


def test_process_reward_accuracy_at_the_thresholds() -> None:
    logits = T([0.0, 1.0, 2.0, -1.0], dtype=D)
    labels = T([0.0, 1.0, 0.5, 0.0])  # float32 labels for float64 scores
    loss, metrics = losses.process_reward_loss(logits, labels)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731  softplus
    want = (sp(0.0) + sp(-1.0) + (0.5 * sp(-2.0) + 0.5 * sp(2.0)) + sp(-1.0)) / 4
    assert loss.dtype == D
    assert loss.item() == pytest.approx(want, rel=1e-12)
    # hits: 0 vs 0 yes; 1 vs 1 yes; a score > 0 vs label 0.5 (not > 0.5) no; -1 vs 0 yes
    assert metrics == {"prm_loss": loss.item(), "step_accuracy": pytest.approx(3 / 4)}
    empty = T([], dtype=D)
    assert losses.process_reward_loss(empty, empty)[1]["step_accuracy"] == 0.0


def test_reward_weighted_flow_defaults_and_metrics() -> None:
    errors = T([[1.0, 3.0], [0.5, 0.5], [2.0, 0.0]], dtype=D)
    rewards = T([0.3, 1.0, -0.2], dtype=D)
    loss, metrics = losses.reward_weighted_flow_loss(errors, rewards)
    exps = [math.exp(r) for r in (0.3, 1.0, -0.2)]  # temperature 1
    w = [e / sum(exps) for e in exps]
    per = [2.0, 0.5, 1.0]
    assert loss.item() == pytest.approx(sum(a * b for a, b in zip(w, per, strict=True)), rel=1e-12)
    ess = math.exp(-sum(x * math.log(x) for x in w))
    assert metrics == {"rwfm_loss": loss.item(), "flow_error": pytest.approx(3.5 / 3),
                       "weight_ess": pytest.approx(ess, rel=1e-12)}
    with pytest.raises(ValueError, match=r"temperature=0 must be > 0"):
        losses.reward_weighted_flow_loss(errors, rewards, temperature=0)


def test_diffusion_dpo_defaults_metrics_and_empty() -> None:
    pc, rc = T([1.0, 2.0, 1.0], dtype=D), T([1.5, 2.0, 1.0], dtype=D)
    pr, rr = T([1.0, 2.0, 1.0], dtype=D), T([1.0, 2.0, 1.5], dtype=D)
    loss, metrics = losses.diffusion_dpo_loss(pc, rc, pr, rr)
    margins = [0.5, 0.0, -0.5]  # beta 1: -((pc - rc) - (pr - rr))
    want = sum(math.log1p(math.exp(-m)) for m in margins) / 3
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert metrics == {"diffusion_dpo_loss": loss.item(), "reward_margin": pytest.approx(0.0),
                       "reward_accuracy": pytest.approx(1 / 3)}  # margin 0 is not a win
    empty = T([], dtype=D)
    _, metrics = losses.diffusion_dpo_loss(empty, empty, empty, empty)
    assert (metrics["reward_margin"], metrics["reward_accuracy"]) == (0.0, 0.0)


# ----------------------------------------------------------------------------- basics and advantages


def test_a_budget_of_one_token_is_allowed_and_the_message_names_the_field() -> None:
    per_token, mask = T([[2.0, 4.0]], dtype=D), T([[1.0, 1.0]], dtype=D)
    got = losses.aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=1)
    assert got.item() == pytest.approx(6.0)
    with pytest.raises(ValueError, match=r"^aggregation='seq-mean-token-sum-norm' needs max_"):
        losses.aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=0)


def test_a_global_count_of_one_token_divides_by_one() -> None:
    per_token, mask = T([[3.0, 9.0]], dtype=D), T([[1.0, 0.0]], dtype=D)
    got = losses.aggregate(per_token, mask, "token-mean", norm=losses.Normaliser.of(mask))
    assert got.item() == pytest.approx(3.0)


def test_token_logprobs_dtypes() -> None:
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 3))
    assert losses.token_logprobs(logits.to(torch.bfloat16), targets).dtype == torch.float32
    temps = T([0.5, 2.0], dtype=D)
    assert losses.token_logprobs(logits.float(), targets, temps).dtype == torch.float32


def test_masked_mean_ignores_masked_positions_whole_tensor() -> None:
    x, mask = T([[1.0, 5.0], [3.0, 7.0]], dtype=D), T([[1.0, 0.0], [1.0, 0.0]], dtype=D)
    assert losses.masked_mean(x, mask).item() == pytest.approx(2.0)
    assert losses.sequence_logprobs(x, mask).tolist() == pytest.approx([1.0, 3.0])


def test_whiten_of_one_token_is_zero() -> None:
    white = losses.masked_whiten(T([[4.0, 8.0]], dtype=D), T([[1.0, 0.0]], dtype=D))
    assert white[0].tolist() == pytest.approx([0.0, 0.0], abs=1e-12)


def test_rloo_group_of_two() -> None:
    adv = losses.rloo_advantages(T([1.0, 0.25], dtype=D), T([0, 0]))
    assert adv.tolist() == pytest.approx([0.75, -0.75])


def test_remax_baseline_is_the_mean_of_several_greedy_rows() -> None:
    rewards = T([1.0, 0.0, 0.5, 2.0], dtype=D)
    greedy = T([False, True, True, False])
    adv = losses.remax_advantages(rewards, T([0, 0, 0, 1]), greedy)
    assert adv.tolist() == pytest.approx([1.0 - 0.25, 0.0, 0.0, 0.0])  # group 1 has no greedy row


def test_gae_defaults_are_gamma_one_lambda_095() -> None:
    rewards, values = T([[0.0, 0.0, 1.0]], dtype=D), T([[0.5, 0.6, 0.7]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    adv, _ = losses.gae(rewards, values, mask)
    want, _ = losses.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    assert adv.tolist() == want.tolist()
    assert adv[0, 2].item() == pytest.approx(0.3)
    assert adv[0, 1].item() == pytest.approx(0.1 + 0.95 * 0.3)


def test_k3_of_a_token_the_policy_cannot_sample_is_capped_not_nan() -> None:
    """log pi = -inf (ref >> pi): d is clamped at +20 before exp, so the estimate is the cap."""
    got = losses.kl_k3(T([-math.inf], dtype=D), T([-1.0], dtype=D))
    assert got.item() == 10.0


def test_regression_losses_keep_the_prediction_dtype() -> None:
    """Targets and rewards are cast to the prediction's dtype: float32 in, float32 loss out."""
    pred = T([1.0, 2.0])
    loss, _ = losses.mse_loss(pred, T([0.5, 1.0], dtype=D))
    assert loss.dtype == torch.float32
    flow, _ = losses.reward_weighted_flow_loss(T([[1.0], [2.0]]), T([0.1, 0.2], dtype=D))
    assert flow.dtype == torch.float32


def test_returns_and_gae_of_one_position() -> None:
    """Responses of a single target position (T = 1)."""
    reward, value, mask = T([[2.0]], dtype=D), T([[0.5]], dtype=D), T([[1.0]], dtype=D)
    assert losses.returns_to_go(reward, mask).tolist() == [[2.0]]
    adv, ret = losses.gae(reward, value, mask)
    assert (adv.tolist(), ret.tolist()) == ([[1.5]], [[2.0]])


def test_advantage_metrics_per_sequence_and_per_token_by_hand() -> None:
    from stacx.trainer.losses import advantage_metrics

    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    per_sequence = torch.tensor([1.5, -0.5])
    assert advantage_metrics(per_sequence, mask) == {
        "advantages_mean": 0.5, "advantages_max": 1.5, "advantages_min": -0.5,
    }
    per_token = torch.tensor([[2.0, 4.0, 100.0], [-100.0, 0.0, -3.0]])  # masked: 100, -100
    assert advantage_metrics(per_token, mask) == pytest.approx(
        {"advantages_mean": 0.75, "advantages_max": 4.0, "advantages_min": -3.0}
    )
    assert advantage_metrics(torch.zeros(0), torch.zeros(0, 3)) == {}


def test_entropy_metrics_equal_torch_categorical_at_each_rows_temperature() -> None:
    from stacx.trainer.losses import entropy_metrics

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, 11, generator=generator, dtype=torch.float64) * 4
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 1]], dtype=torch.float32)
    temperatures = torch.tensor([1.0, 0.5, 2.0])
    # torch's own Categorical, at the temperature each row was sampled at, over the masked tokens
    expected = torch.distributions.Categorical(logits=logits / temperatures.view(-1, 1, 1)).entropy()
    want = float(expected[mask > 0].mean())
    assert entropy_metrics(logits, mask, temperatures) == {"entropy": pytest.approx(want, rel=1e-9)}
    untempered = float(torch.distributions.Categorical(logits=logits).entropy()[mask > 0].mean())
    assert entropy_metrics(logits, mask) == {"entropy": pytest.approx(untempered, rel=1e-9)}
    uniform = torch.zeros(1, 2, 7)  # the largest entropy: log V
    assert entropy_metrics(uniform, torch.ones(1, 2)) == {"entropy": pytest.approx(math.log(7))}
    assert entropy_metrics(logits, torch.zeros(3, 5)) == {}
