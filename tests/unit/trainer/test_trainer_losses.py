"""Losses and advantage estimators against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trainer import losses

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
        assert (sum(parts) / 2).item() == pytest.approx(full.item(), abs=1e-12), how


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


def split_ranks(call, shards):  # type: ignore[no-untyped-def]
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

        def reduce(t: torch.Tensor, r: int = r, calls=calls) -> torch.Tensor:  # type: ignore[no-untyped-def]
            k = next(calls)
            return t + sum(recorded[o][k] for o in range(n) if o != r)

        outs.append(call(shard, losses.Normaliser(0.0, 0.0, dp_size=n, all_reduce=reduce)))
    return outs


PAIR = torch.tensor([[-1.0, -2.5, -1.2, -1.9], [-3.0, -1.0, -2.0, -0.5], [-2.0, -2.1, -1.0, -1.5],
                     [-2.5, -1.5, -2.2, -1.0], [-0.5, -0.3, -1.1, -0.8]], dtype=D).T  # [P=4, 5]
PAIR_SHARDS = [torch.tensor([0]), torch.tensor([1, 2, 3])]


def pair_losses() -> dict[str, object]:
    """Every per-pair loss, called on the rows `idx` of PAIR with a normaliser."""
    def kto(i, norm):  # type: ignore[no-untyped-def]
        return losses.kto_loss(PAIR[i, 0] + 2.0, PAIR[i, 1], PAIR[i, 2] > -1.5, beta=0.7,
                               desirable_weight=1.5, undesirable_weight=0.5, norm=norm)

    def orpo(i, norm):  # type: ignore[no-untyped-def]
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
    whole, _ = call(torch.arange(4), None)  # type: ignore[operator]
    parts = split_ranks(call, PAIR_SHARDS)
    assert whole.dtype == D
    assert (sum(p[0] for p in parts) / 2).item() == pytest.approx(whole.item(), rel=1e-12)


TOKEN_LOGP = torch.tensor([[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.5, -0.2, -0.9],
                           [-2.2, -0.4, -1.1, -0.6]], dtype=D)
TOKEN_OLD = torch.tensor([[-1.3, -0.4, -1.0, -0.1], [-0.3, -0.5, -0.9, -0.2],
                          [-2.0, -0.9, -1.1, -0.6]], dtype=D)
TOKEN_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]],
                          dtype=D)
TOKEN_ADV = torch.tensor([[1.0], [-2.0], [0.5]], dtype=D)


def token_losses() -> dict[str, object]:
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
    whole, _ = call(torch.arange(3), None)  # type: ignore[operator]
    full = losses.Normaliser.of(TOKEN_MASK)
    norm = losses.Normaliser(full.num_tokens, full.num_sequences, dp_size=2)
    parts = [call(r, norm)[0] for r in (torch.tensor([0]), torch.tensor([1, 2]))]  # type: ignore[operator]
    assert (sum(parts) / 2).item() == pytest.approx(whole.item(), rel=1e-12)


def test_pair_counts_are_summed_exactly_past_float32() -> None:
    """2^24 + 1 pairs on other ranks: the summed count must stay exact (float64), not round."""
    others = float(2 ** 24 + 1)
    norm = losses.Normaliser(0.0, 0.0, dp_size=2, all_reduce=lambda t: t + others)
    pairs = torch.tensor([0.3, 0.5], dtype=D)
    want = pairs.sum().item() / (others + 2) * 2
    assert losses.pair_mean(pairs, norm).item() == pytest.approx(want, rel=1e-13)
    dpo, _ = losses.dpo_loss(pairs, -pairs, pairs * 0, pairs * 0, norm=norm)
    dpo_want = -torch.nn.functional.logsigmoid(0.2 * pairs).sum().item() / (others + 2) * 2
    assert dpo.item() == pytest.approx(dpo_want, rel=1e-13)
    token = torch.full((1, 3), -1.0, dtype=D)
    orpo, metrics = losses.orpo_loss(pairs[:1] * 0 - 1, pairs[:1] * 0 - 2, token,
                                     torch.ones(1, 3), lam=0.0, norm=norm)
    assert metrics["nll_chosen"] == pytest.approx(3.0 / (others + 3) * 2, rel=1e-13)
