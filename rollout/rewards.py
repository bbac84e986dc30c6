"""Reward functions by name. Untrusted answers never raise: an unparseable one scores 0."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from rollout.errors import ConfigError
from rollout.protocols import RewardFunction

__all__ = ["REWARDS", "exact_answer", "exact_match", "get_reward", "register_reward"]

REWARDS: dict[str, RewardFunction] = {}

_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def register_reward(name: str) -> Callable[[RewardFunction], RewardFunction]:
    """Decorator: make a reward function available to configs as `reward: <name>`."""

    def add(fn: RewardFunction) -> RewardFunction:
        REWARDS[name] = fn
        return fn

    return add


def get_reward(name: str) -> RewardFunction:
    if name not in REWARDS:
        raise ConfigError(f"reward {name!r} is unknown; use `verifier` or one of {sorted(REWARDS)}")
    return REWARDS[name]


def _normalise(text: str) -> str:
    return text.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")


def _as_number(text: str) -> float | None:
    text = _normalise(text)
    return float(text) if _NUMBER.match(text) else None


@register_reward("exact_answer")
def exact_answer(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when the answer equals `data["answer"]` (numerically when both are numbers)."""
    if answer is None or "answer" not in data:
        return {"reward": 0.0, "answered": 0.0}
    expected = str(data["answer"])
    got_num, want_num = _as_number(answer), _as_number(expected)
    if got_num is not None and want_num is not None:
        correct = math.isclose(got_num, want_num, rel_tol=1e-9, abs_tol=1e-9)
    else:
        correct = _normalise(answer) == _normalise(expected)
    return {"reward": float(correct), "answered": 1.0}


@register_reward("exact_match")
def exact_match(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when the stripped answer string equals `data["answer"]`."""
    correct = answer is not None and answer.strip() == str(data.get("answer", "")).strip()
    return {"reward": float(correct), "answered": float(answer is not None)}
