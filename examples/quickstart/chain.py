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

import json
import random
from dataclasses import dataclass

from quickstart.arithmetic import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    MIN_FACTOR,
    TASK_TYPE,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ArithmeticTasks,
    DemonstrationConfig,
    distinct_problems,
    reward,
    score,
    tool_response_text,
)

__all__ = ["TASK_TYPE", "ChainTasks", "Problem", "demonstration", "make_problems", "reward", "sample_problem",
           "score", "tool_response_text"]


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

    def task_data(self) -> str:
        """JSON payload carried by the `TaskSample` (what the reward needs)."""
        return json.dumps({"answer": str(self.answer), "expression": self.expression})


def sample_problem(rng: random.Random) -> Problem:
    a, b, c = rng.randint(MIN_FACTOR, 99), rng.randint(MIN_FACTOR, 99), rng.randint(1, 99)
    d, e = rng.randint(MIN_FACTOR, 99), rng.randint(MIN_FACTOR, 99)
    sign = rng.choice("+-")
    inner_value = a * b + c if sign == "+" else a * b - c
    return Problem(inner=f"{a}*{b}{sign}{c}", outer=f"{d}*{e}", inner_value=inner_value,
                   answer=inner_value + d * e)


def make_problems(num: int, *, seed: int, exclude: frozenset[str] = frozenset()) -> list[Problem]:
    """`num` distinct problems (none whose expression is in `exclude`), reproducible by `seed`."""
    return distinct_problems(num, sample_problem, seed=seed, exclude=exclude)


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


class ChainTasks(ArithmeticTasks):
    """Task source (`tasks: {source: quickstart.chain:ChainTasks}`): the quickstart's, with the
    two-step problems, more held-out problems and a warm start that rarely calls the tool."""

    sample = staticmethod(sample_problem)
    demonstrate = staticmethod(demonstration)

    def __init__(self, *, num_train: int = 4096, num_heldout: int = 512, seed: int = 0,
                 tool_fraction: float = 0.15, mental_accuracy: float = 0.1,
                 skill_tool_fraction: float = 0.9) -> None:
        super().__init__(num_train=num_train, num_heldout=num_heldout, seed=seed, tool_fraction=tool_fraction,
                         mental_accuracy=mental_accuracy, skill_tool_fraction=skill_tool_fraction)
