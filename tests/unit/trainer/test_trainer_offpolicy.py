"""Off-policy correction, behaviour logprobs and option validation, by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from stacx.trainer import InMemoryBatchSource, RecipeError, StacxTrainer, get_recipe, to_tensor_batch
from stacx.trainer.errors import ConfigError
from stacx.trainer.offpolicy import importance_weights, mismatch_metrics
from stacx.trainer.specialization import behaviour_logprobs
from stacx.trainer.testing import synthetic_batch, tiny_trainer_config

T = torch.tensor
LN2 = math.log(2.0)


def test_token_modes_by_hand() -> None:
    # rho = 2, 1/2, 4 on three tokens; cap 3
    old, mu, mask = T([[LN2, -LN2, 2 * LN2]]), torch.zeros(1, 3), torch.ones(1, 3)
    w, m = importance_weights(old, mu, mask, mode="token-truncate", cap=3.0)
    assert w is not None and w[0].tolist() == pytest.approx([2.0, 0.5, 3.0])
    assert m["is_clip_frac"] == pytest.approx(1 / 3) and m["is_masked_frac"] == 0.0
    assert m["is_ratio_mean"] == pytest.approx((2 + 0.5 + 4) / 3)
    w, m = importance_weights(old, mu, mask, mode="token-mask", cap=3.0, floor=0.6)
    assert w is not None and w[0].tolist() == pytest.approx([2.0, 0.0, 0.0])
    assert m["is_masked_frac"] == pytest.approx(2 / 3) and m["is_clip_frac"] == 0.0


def test_sequence_modes_use_the_product_of_token_ratios() -> None:
    old = T([[LN2, LN2, 9.0], [-LN2, 0.0, 0.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # the 9.0 is off the mask
    w, m = importance_weights(old, torch.zeros(2, 3), mask, mode="sequence-truncate", cap=3.0)
    assert w is not None and w.shape == (2, 1) and w[:, 0].tolist() == pytest.approx([3.0, 0.5])
    w, m = importance_weights(old, torch.zeros(2, 3), mask, mode="sequence-mask", cap=3.0)
    assert w is not None and w[:, 0].tolist() == pytest.approx([0.0, 0.5])
    assert m["is_masked_frac"] == pytest.approx(0.5)


def test_unknown_mode_and_bad_bounds_are_rejected() -> None:
    with pytest.raises(ValueError, match="off_policy='tis' is unknown"):
        importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                           mode="tis")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="off_policy_cap=0.5 must be >= 1"):
        importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                           mode="token-mask", cap=0.5)


def test_mismatch_metrics_by_hand() -> None:
    m = mismatch_metrics(T([[LN2, 0.0, 5.0]]), torch.zeros(1, 3), T([[1.0, 1.0, 0.0]]))
    assert m["mismatch_abs_max"] == pytest.approx(LN2)  # the 5.0 is off the mask
    assert m["mismatch_kl"] == pytest.approx((2 - 1 - LN2) / 2)


def test_recorded_all_zero_logprobs_are_used() -> None:
    """A row whose sampled logprobs are genuinely 0 (probability 1) is not 'unrecorded'."""
    batch = to_tensor_batch(synthetic_batch(0, recorded_logprobs=True))
    batch = dataclasses.replace(batch, old_logprobs=torch.zeros_like(batch.old_logprobs))
    logp = torch.full_like(batch.old_logprobs, -0.5)
    old, recorded = behaviour_logprobs(logp, batch)
    assert recorded.all() and torch.equal(old, torch.zeros_like(old))


def test_unrecorded_rows_fall_back_to_the_current_policy() -> None:
    record = synthetic_batch(0, recorded_logprobs=True)
    record.logprobs_recorded = np.array([1, 0, 1, 1], dtype=np.uint8)
    batch = to_tensor_batch(record)
    logp = torch.full_like(batch.old_logprobs, -0.5)
    old, _ = behaviour_logprobs(logp, batch)
    assert torch.equal(old[1], logp[1]) and torch.equal(old[0], batch.old_logprobs[0])


def test_batches_of_older_producers_keep_the_zero_rule() -> None:
    record = synthetic_batch(0, recorded_logprobs=True)
    record.logprobs_recorded = None
    start, length = int(record.offsets[1]), int(record.lengths[1])
    record.logprobs[start:start + length] = 0.0
    recorded = to_tensor_batch(record).logprobs_recorded
    assert recorded is not None and recorded.tolist() == [True, False, True, True]


@pytest.mark.parametrize(("option", "value", "message"), [
    ("aggregation", "bogus", r"role_options.policy.aggregation: expected 'token-mean', .*got 'bogus'"),
    ("aggregation", "seq-mean-token-sum-norm",
     "role_options.policy: GRPO: aggregation=.seq-mean-token-sum-norm. needs max_tokens"),
    ("off_policy", "tis", r"role_options.policy.off_policy: expected 'none', .*got 'tis'"),
    ("kl_estimator", "k4", "role_options.policy.kl_estimator: expected 'k1', 'k2' or 'k3', got 'k4'"),
    ("dual_clip", 0.5, "role_options.policy: GRPO: dual_clip=0.5 must be > 1"),
])
def test_bad_role_options_fail_at_construction(option: str, value: object, message: str) -> None:
    """Checked against the options the recipe declares before any role is built, with the path."""
    config = tiny_trainer_config("grpo", role_options={"policy": {option: value}})
    with pytest.raises(ConfigError, match=f"^{message}"):
        StacxTrainer(config, source=InMemoryBatchSource([]))


def test_every_policy_gradient_recipe_offers_every_option() -> None:
    for name in ("grpo", "dapo", "dr_grpo", "gspo", "rloo", "ppo", "reinforce_pp",
                 "online_reward"):
        spec = next(r.specialization for r in get_recipe(name).roles if r.name == "policy")
        for mode in ("token-truncate", "sequence-mask"):
            assert dataclasses.replace(spec, off_policy=mode).off_policy == mode  # type: ignore[type-var]
        with pytest.raises(RecipeError, match="unknown"):
            dataclasses.replace(spec, aggregation="bogus")  # type: ignore[type-var]


@pytest.mark.parametrize("mode", ["none", "token-truncate", "sequence-mask"])
def test_a_step_reports_off_policy_metrics(mode: str) -> None:
    config = tiny_trainer_config("grpo", role_options={"policy": {"off_policy": mode}})
    trainer = StacxTrainer(config, source=InMemoryBatchSource(
        [synthetic_batch(0, recorded_logprobs=True)]))
    metrics = trainer.run(1)[0].metrics
    assert metrics["policy/mismatch_kl"] > 0 and metrics["policy/mismatch_abs_max"] > 0
    if mode == "none":
        assert metrics["policy/clip_frac"] > 0  # PPO clips around the (random) behaviour policy
    else:
        assert {"policy/is_ratio_mean", "policy/is_clip_frac", "policy/is_masked_frac"} <= set(
            metrics)
        assert metrics["policy/clip_frac"] == 0.0  # around pi_old: ratio 1 before the update
