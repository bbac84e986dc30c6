"""Reward functions by name (`reward:`): registered, `package.module:function`, or an entry point
in `stacx.rewards`. Untrusted answers never raise: an unparseable one scores 0."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import re
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from stacx.rollout.errors import ConfigError, RewardError
from stacx.rollout.protocols import EnvironmentSession, RewardFunction
from stacx.schemas.plugins import PluginError, Registry, accepts
from stacx.schemas.records import TaskSample

__all__ = [
    "REWARDS",
    "VERIFIERS",
    "Verifier",
    "exact_answer",
    "exact_match",
    "get_reward",
    "get_verifier",
    "harbor_verifier",
    "math_equivalent",
    "register_reward",
    "reward_components",
]


def _check(fn: Any) -> str | None:
    return accepts(fn, "answer", {})


REWARDS: Registry[RewardFunction] = Registry("rewards", what="reward function", check=_check)
"""`reward(answer: str | None, data: Mapping) -> {"reward": float, ...}` by name."""

_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def register_reward(name: str) -> Callable[[RewardFunction], RewardFunction]:
    """Decorator: make a reward function available to configs as `reward: <name>`."""

    return REWARDS.register(name)


def get_reward(ref: str, options: Mapping[str, Any] | None = None) -> RewardFunction:
    """The reward function `ref` names, with keyword `options` bound; `ConfigError` otherwise."""
    try:
        fn = REWARDS.resolve(ref)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    if not options:
        return fn
    problem = accepts(fn, "answer", {}, **options)
    if problem:
        raise ConfigError(f"{ref!r}: reward_options do not fit: {problem}")
    return functools.partial(fn, **options)


def reward_components(result: object, *, source: str, verifier: bool = False) -> dict[str, float]:
    """The named components of what a reward function or a verifier returned, `reward` among
    them; `RewardError` naming `source` (the episode fails with it as its reason) when it is not a
    mapping of names to finite numbers, or has no `reward` (a verifier's lone component is its
    reward, as a Harbor reward.json of one number)."""
    if not isinstance(result, Mapping):
        raise RewardError(
            f"{source} returned a {type(result).__name__}, not a mapping of component names to numbers"
        )
    components: dict[str, float] = {}
    for name, value in result.items():
        if not isinstance(name, str):
            raise RewardError(f"{source} returned a component named {name!r}; names are strings")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardError(f"{source} component {name!r} is a {type(value).__name__}, not a number")
        if not math.isfinite(value):
            raise RewardError(f"{source} component {name!r} is {float(value)}; rewards are finite numbers")
        components[name] = float(value)
    if "reward" not in components:
        if verifier and len(components) == 1:
            components["reward"] = next(iter(components.values()))
        else:
            raise RewardError(f"{source} returned no 'reward' component (got {sorted(components)}); "
                              "return {'reward': <number>, ...}")
    return components


def _normalise(text: str) -> str:
    return text.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")


def _as_number(text: str) -> float | None:
    text = _normalise(text)
    return float(text) if _NUMBER.match(text) else None


@REWARDS.register("exact_answer", origin="builtin (stacx.rollout.rewards)")
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


@REWARDS.register("exact_match", origin="builtin (stacx.rollout.rewards)")
def exact_match(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when the stripped answer string equals `data["answer"]`."""
    correct = answer is not None and answer.strip() == str(data.get("answer", "")).strip()
    return {"reward": float(correct), "answered": float(answer is not None)}


def _in_math(text: str) -> str:
    """`text` as math-verify reads a gold answer: bare numbers and LaTeX both inside `$...$`.
    An escaped `\\$` is a currency sign, not a math delimiter: it is dropped (`\\$32` is 32)."""
    stripped = text.strip().replace("\\$", "")
    return stripped if "$" in stripped or "\\boxed" in stripped else f"${stripped}$"


@REWARDS.register("math_equivalent", origin="builtin (stacx.rollout.rewards)")
def math_equivalent(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """1.0 when math-verify finds the answer mathematically equal to `data["answer"]`
    (`1/2`, `0.5` and `\\frac{1}{2}` agree); an answer it cannot parse scores 0."""
    if answer is None or "answer" not in data:
        return {"reward": 0.0, "answered": 0.0}
    from math_verify import parse, verify

    # math-verify's timeouts use signal.alarm, which only the main thread may set
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(_in_math(str(data["answer"])), parsing_timeout=limit)
        guess = parse(_in_math(answer), parsing_timeout=limit)
        correct = bool(gold) and bool(guess) and verify(gold, guess, timeout_seconds=limit)
    except Exception:  # untrusted model output: whatever the parser makes of it scores 0
        correct = False
    return {"reward": float(correct), "answered": 1.0}


Verifier = Callable[[EnvironmentSession, TaskSample], Awaitable[Mapping[str, float]]]
"""`async verify(session, task) -> {"reward": float, ...}`: scores an episode inside its sandbox."""


def _check_verifier(fn: Any) -> str | None:
    problem = accepts(fn, None, None)
    if problem is None and not inspect.iscoroutinefunction(inspect.unwrap(fn)):
        return "must be an async function `async def verify(session, task) -> dict[str, float]`"
    return problem


VERIFIERS: Registry[Verifier] = Registry("verifiers", what="verifier", check=_check_verifier)
"""Verifiers used by `reward: verifier`, chosen by the evaluator's `verifier:` field."""


@VERIFIERS.register("harbor", origin="builtin (stacx.rollout.rewards)")
async def harbor_verifier(session: EnvironmentSession, task: TaskSample) -> Mapping[str, float]:
    """The task's tests in the sandbox (`bash /tests/test.sh`, then /logs/verifier/reward.*)."""
    return await session.verify()


def get_verifier(ref: str, options: Mapping[str, Any] | None = None) -> Verifier:
    """The verifier `ref` names, with keyword `options` bound; `ConfigError` otherwise."""
    try:
        fn = VERIFIERS.resolve(ref)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    if not options:
        return fn
    problem = accepts(fn, None, None, **options)
    if problem:
        raise ConfigError(f"{ref!r}: verifier_options do not fit: {problem}")
    return functools.partial(fn, **options)
