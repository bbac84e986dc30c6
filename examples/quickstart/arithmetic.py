"""ReTool-style tool-integrated arithmetic: problems, SFT demonstrations and the reward.

An episode (one assistant turn, optionally interrupted by one tool call):

    What is 37*48+19?                                   <- user prompt
    <tool_call>print(37*48+19)</tool_call>              <- policy: asks the Python tool
    <tool_response>1795</tool_response>                  <- sandbox output (not trained on)
    <answer>1795</answer>                                <- policy: final answer

or, answering "mentally" (the tiny policy cannot multiply two-digit numbers in its head):

    <answer>1785</answer>

The warm-start demonstrations mix both behaviours: a fraction `tool_fraction` use the tool
(always correct); the rest answer directly and are right only `mental_accuracy` of the time.
After SFT the policy therefore succeeds about `tool_fraction` of the time; GRPO with reward 1
for a correct answer reinforces the tool call, which is the only reliable route to reward.

This module is deliberately free of torch and of STACX imports so that the task generator,
the demonstrations and the reward can be used anywhere (prototype, pipeline, tests).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "TASK_TYPE",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "MIN_FACTOR",
    "DemonstrationConfig",
    "Problem",
    "demonstration",
    "extract_answer",
    "extract_tool_code",
    "make_problems",
    "reward",
    "sample_problem",
    "tool_response_text",
    "used_tool",
]

TASK_TYPE = "arithmetic_tool"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"\s*(-?\d+)\s*" + re.escape(ANSWER_CLOSE))
_TOOL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.S)
_TEMPLATES = ("{a}*{b}+{c}", "{a}*{b}-{c}", "{c}+{a}*{b}")


@dataclass(frozen=True, slots=True)
class Problem:
    """One arithmetic question with its exact integer answer."""

    expression: str
    """Python expression, e.g. `37*48+19`."""
    answer: int
    """Its value."""

    @property
    def prompt(self) -> str:
        return f"What is {self.expression}?"

    def task_data(self) -> str:
        """JSON payload carried by the `TaskSample` (what the reward needs)."""
        return json.dumps({"answer": str(self.answer), "expression": self.expression})


MIN_FACTOR = 34
"""Factors are drawn from 34..99 so that every answer has exactly four digits (1057..9900):
the tiny policy then copies the tool output at one fixed offset, which it learns reliably."""


def sample_problem(rng: random.Random) -> Problem:
    """Two two-digit factors and a one- or two-digit addend/subtrahend."""
    a, b, c = rng.randint(MIN_FACTOR, 99), rng.randint(MIN_FACTOR, 99), rng.randint(1, 99)
    template = rng.choice(_TEMPLATES)
    value = a * b - c if "-" in template else a * b + c
    return Problem(expression=template.format(a=a, b=b, c=c), answer=value)


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


@dataclass(kw_only=True, slots=True)
class DemonstrationConfig:
    """How the synthetic warm-start demonstrations behave."""

    tool_fraction: float = 0.3
    """Share of demonstrations that call the Python tool (these are always correct)."""
    mental_accuracy: float = 0.5
    """Probability that a direct ("mental") answer is right; otherwise it is off by a little."""

    def __post_init__(self) -> None:
        for name in ("tool_fraction", "mental_accuracy"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"DemonstrationConfig.{name}={value}: must lie in [0, 1]")


def tool_response_text(stdout: str) -> str:
    """The observation the ReTool scaffold (`rollout.scaffolds.ToolCallingScaffold.observe`)
    appends after a tool call; kept identical so that demonstrations match rollouts."""
    return f"\n{TOOL_RESPONSE_OPEN}\n{stdout}\n{TOOL_RESPONSE_CLOSE}\n"


def demonstration(problem: Problem, rng: random.Random, config: DemonstrationConfig,
                  *, end: str = "") -> list[str]:
    """The assistant side of one demonstration as segments: [policy, observation, policy] or
    [policy]. Observation segments (odd indices) get loss mask 0 in SFT; `end` (the
    end-of-turn token) closes the last policy segment."""
    if rng.random() < config.tool_fraction:
        return [
            f"{TOOL_CALL_OPEN}print({problem.expression}){TOOL_CALL_CLOSE}",
            tool_response_text(f"{problem.answer}\n"),
            f"{ANSWER_OPEN}{problem.answer}{ANSWER_CLOSE}{end}",
        ]
    guess = problem.answer
    if rng.random() >= config.mental_accuracy:
        guess += rng.choice((-1, 1)) * rng.choice((1, 2, 10, 20, 100))
    return [f"{ANSWER_OPEN}{guess}{ANSWER_CLOSE}{end}"]


def extract_answer(completion: str) -> int | None:
    """The integer in the last `<answer>…</answer>`, or None when there is none."""
    matches = _ANSWER_RE.findall(completion)
    return int(matches[-1]) if matches else None


def extract_tool_code(text: str) -> str | None:
    """Python code of the first `<tool_call>…</tool_call>` in `text`, or None."""
    match = _TOOL_RE.search(text)
    return match.group(1) if match else None


def used_tool(completion: str) -> bool:
    return TOOL_CALL_OPEN in completion


def reward(completion: str, answer: int | str) -> float:
    """1.0 for a correct final answer, else 0.0.

    Untrusted model output never raises: a missing or malformed answer simply scores 0.
    """
    got = extract_answer(completion)
    try:
        return 1.0 if got is not None and got == int(answer) else 0.0
    except (TypeError, ValueError):  # a malformed expected answer is the task's fault: score 0
        return 0.0
