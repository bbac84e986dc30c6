"""What a reward function or a verifier returns becomes the episode's reward components, or the
episode fails with one line: NaN/inf and a missing `reward` never score silently."""

from __future__ import annotations

import pytest

from stacx.rollout.errors import RewardError
from stacx.rollout.rewards import reward_components


def test_a_verifiers_lone_component_is_its_reward() -> None:
    assert reward_components({"accuracy": 0.5}, source="verifier 'harbor'", verifier=True) == {
        "accuracy": 0.5, "reward": 0.5}


def test_a_verifier_with_several_components_and_no_reward_is_an_error() -> None:
    with pytest.raises(RewardError, match=r"returned no 'reward' component \(got \['a', 'b'\]\)"):
        reward_components({"a": 1.0, "b": 0.0}, source="verifier 'harbor'", verifier=True)


def test_a_reward_functions_components_are_kept() -> None:
    assert reward_components({"reward": 1, "tool": 0.0}, source="reward 'x'") == {"reward": 1.0, "tool": 0.0}
