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
    assert white[0].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-4)


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
    assert losses.aggregate(per_token, mask, "seq-mean-token-sum-norm").item() == \
        pytest.approx((4 / 4 + 3 / 4) / 2)
