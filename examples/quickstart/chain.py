"""Two-step tool-integrated arithmetic: the race task of `bench/peer_trl.py`.

An episode needs two tool calls, the second built on the first one's output:

    What is (37*48+19)+56*71?                            <- user prompt
    <tool_call>print(37*48+19)</tool_call>              <- policy: the inner part
    <tool_response>1795</tool_response>                  <- sandbox output (not trained on)
    <tool_call>print(1795+56*71)</tool_call>            <- policy: the result carried on
    <tool_response>5771</tool_response>
    <answer>5771</answer>                                <- policy: final answer

or a direct ("mental") answer, which the tiny policy rarely gets right. The warm-start
demonstrations use the two-call route only `tool_fraction` of the time, so the SFT policy starts
low; reward 1 for the exact answer makes the full chain (two calls, both copies right) the route to
reward, which takes GRPO many policy versions to reinforce. Prompts, reward and tool-response format
are those of `quickstart.arithmetic`; the module is free of torch and of STACX imports, like it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from quickstart.arithmetic import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    MIN_FACTOR,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    DemonstrationConfig,
    reward,
    score,
    tool_response_text,
)

__all__ = ["ChainTasks", "Problem", "demonstration", "make_problems", "reward", "sample_problem", "score",
           "tool_response_text"]

TASK_TYPE = "arithmetic_tool"


@dataclass(frozen=True, slots=True)
class Problem:
    """`(inner)+outer`: `inner` is `a*b+c` or `a*b-c`, `outer` is `d*e`."""

    inner: str
    outer: str
    inner_value: int
    answer: int

    @property
    def expression(self) -> str:
        return f"({self.inner})+{self.outer}"

    @property
    def prompt(self) -> str:
        return f"What is {self.expression}?"

    def task_data(self) -> dict[str, str]:
        return {"answer": str(self.answer), "expression": self.expression}


def sample_problem(rng: random.Random) -> Problem:
    a, b, c = rng.randint(MIN_FACTOR, 99), rng.randint(MIN_FACTOR, 99), rng.randint(1, 99)
    d, e = rng.randint(MIN_FACTOR, 99), rng.randint(MIN_FACTOR, 99)
    sign = rng.choice("+-")
    inner_value = a * b + c if sign == "+" else a * b - c
    return Problem(inner=f"{a}*{b}{sign}{c}", outer=f"{d}*{e}", inner_value=inner_value,
                   answer=inner_value + d * e)


def make_problems(num: int, *, seed: int, exclude: frozenset[str] = frozenset()) -> list[Problem]:
    """`num` distinct problems (none whose expression is in `exclude`), reproducible by `seed`."""
    rng = random.Random(seed)
    seen: set[str] = set(exclude)
    problems: list[Problem] = []
    while len(problems) < num:
        problem = sample_problem(rng)
        if problem.expression not in seen:
            seen.add(problem.expression)
            problems.append(problem)
    return problems


def demonstration(problem: Problem, rng: random.Random, config: DemonstrationConfig,
                  *, end: str = "") -> list[str]:
    """[policy, observation, policy, observation, policy] (the two-call chain) or [policy]."""
    if rng.random() < config.tool_fraction:
        return [
            f"{TOOL_CALL_OPEN}print({problem.inner}){TOOL_CALL_CLOSE}",
            tool_response_text(f"{problem.inner_value}\n"),
            f"{TOOL_CALL_OPEN}print({problem.inner_value}+{problem.outer}){TOOL_CALL_CLOSE}",
            tool_response_text(f"{problem.answer}\n"),
            f"{ANSWER_OPEN}{problem.answer}{ANSWER_CLOSE}{end}",
        ]
    guess = problem.answer
    if rng.random() >= config.mental_accuracy:
        guess += rng.choice((-1, 1)) * rng.choice((1, 2, 10, 20, 100))
    return [f"{ANSWER_OPEN}{guess}{ANSWER_CLOSE}{end}"]


class ChainTasks:
    """Task source (`tasks: {source: quickstart.chain:ChainTasks}`): held-out problems first
    (seed 10000 + seed), training problems excluding them, demonstrations of both routes."""

    def __init__(self, *, num_train: int = 4096, num_heldout: int = 512, seed: int = 0,
                 tool_fraction: float = 0.15, mental_accuracy: float = 0.1,
                 skill_tool_fraction: float = 0.9) -> None:
        if num_train < 1 or num_heldout < 1:
            raise ValueError("num_train and num_heldout must be >= 1")
        self.heldout = make_problems(num_heldout, seed=10_000 + seed)
        self.exclude = frozenset(p.expression for p in self.heldout)
        self.train = make_problems(num_train, seed=seed, exclude=self.exclude)
        self.skill = DemonstrationConfig(tool_fraction=skill_tool_fraction, mental_accuracy=mental_accuracy)
        self.mixture = DemonstrationConfig(tool_fraction=tool_fraction, mental_accuracy=mental_accuracy)

    def train_tasks(self) -> list[dict[str, Any]]:
        return _rows(self.train, prefix="train")

    def heldout_tasks(self) -> list[dict[str, Any]]:
        return _rows(self.heldout, prefix="heldout")

    def demonstration(self, rng: random.Random, *, skill: bool) -> tuple[str, list[str]]:
        problem = sample_problem(rng)
        while problem.expression in self.exclude:
            problem = sample_problem(rng)
        return problem.prompt, demonstration(problem, rng, self.skill if skill else self.mixture)


def _rows(problems: list[Problem], *, prefix: str) -> list[dict[str, Any]]:
    return [
        {"task_id": f"{prefix}-{i:05d}", "task_type": TASK_TYPE, "prompt": p.prompt, "data": p.task_data()}
        for i, p in enumerate(problems)
    ]
