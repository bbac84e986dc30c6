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

The quickstart names this module as a plug-in (examples/quickstart.yaml, with `examples/` on its
`plugin_paths`): `ArithmeticTasks` is the task source (training and held-out problems, SFT
demonstrations) and `score` the reward. It is deliberately free of torch and of STACX imports so
that the task generator, the demonstrations and the reward can be used anywhere (pipeline,
tests).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "TASK_TYPE",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "MIN_FACTOR",
    "ArithmeticTasks",
    "DemonstrationConfig",
    "Problem",
    "demonstration",
    "extract_answer",
    "extract_tool_code",
    "make_problems",
    "reward",
    "sample_problem",
    "score",
    "tool_response_text",
    "used_tool",
]

TASK_TYPE = "arithmetic_tool"


class Expressed(Protocol):
    """A problem: what it asks, as one expression (distinct problems have distinct expressions)."""

    @property
    def expression(self) -> str: ...


P = TypeVar("P", bound=Expressed)
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


def distinct_problems(
    num: int, sample: Callable[[random.Random], P], *, seed: int, exclude: frozenset[str] = frozenset()
) -> list[P]:
    """`num` problems of `sample` with distinct expressions (none in `exclude`), reproducible by `seed`."""
    rng = random.Random(seed)
    seen: set[str] = set(exclude)
    problems: list[P] = []
    while len(problems) < num:
        problem = sample(rng)
        if problem.expression not in seen:
            seen.add(problem.expression)
            problems.append(problem)
    return problems


def make_problems(num: int, *, seed: int, exclude: frozenset[str] = frozenset()) -> list[Problem]:
    """`num` distinct problems (none whose expression is in `exclude`), reproducible by `seed`."""
    return distinct_problems(num, sample_problem, seed=seed, exclude=exclude)


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
    """The observation the ReTool scaffold (`stacx.rollout.scaffolds.ToolCallingScaffold.observe`)
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


def score(answer: str | None, data: Mapping[str, Any]) -> dict[str, float]:
    """The rollout reward (`reward: quickstart.arithmetic:score`): 1.0 when the final answer (the
    scaffold's `<answer>` text) is the problem's integer, else 0.0; `answered` says one was given."""
    if answer is None:
        return {"reward": 0.0, "answered": 0.0}
    return {"reward": reward(f"{ANSWER_OPEN}{answer.strip()}{ANSWER_CLOSE}", data.get("answer", "")),
            "answered": 1.0}


class ArithmeticTasks:
    """The quickstart's task source (`tasks: {source: quickstart.arithmetic:ArithmeticTasks}`):
    held-out problems first, training problems excluding them, demonstrations of both.

    A task of another problem shape subclasses it and names its own `sample` and `demonstrate`
    (see `quickstart.chain`)."""

    sample: Callable[[random.Random], Any] = staticmethod(sample_problem)
    demonstrate: Callable[..., list[str]] = staticmethod(demonstration)

    def __init__(self, *, num_train: int = 4096, num_heldout: int = 128, seed: int = 0,
                 tool_fraction: float = 0.3, mental_accuracy: float = 0.5,
                 skill_tool_fraction: float = 0.9) -> None:
        """`tool_fraction`: share of the final demonstrations that call the Python tool (always
        correct), hence the warm-started policy's tool-use rate; `mental_accuracy`: how often a
        direct answer in a demonstration is right; `skill_tool_fraction`: tool share of the first
        (skill) SFT steps, where the tiny model learns to copy the expression and the output."""
        if num_train < 1 or num_heldout < 1:
            raise ValueError("num_train and num_heldout must be >= 1")
        self.heldout = distinct_problems(num_heldout, self.sample, seed=10_000 + seed)
        self.exclude = frozenset(p.expression for p in self.heldout)
        self.train = distinct_problems(num_train, self.sample, seed=seed, exclude=self.exclude)
        self.skill = DemonstrationConfig(tool_fraction=skill_tool_fraction, mental_accuracy=mental_accuracy)
        self.mixture = DemonstrationConfig(tool_fraction=tool_fraction, mental_accuracy=mental_accuracy)

    def train_tasks(self) -> list[dict[str, Any]]:
        return _rows(self.train, prefix="train")

    def heldout_tasks(self) -> list[dict[str, Any]]:
        return _rows(self.heldout, prefix="heldout")

    def demonstration(self, rng: random.Random, *, skill: bool) -> tuple[str, list[str]]:
        """(prompt, segments) of one fresh demonstration (never a held-out problem)."""
        problem = self.sample(rng)
        while problem.expression in self.exclude:
            problem = self.sample(rng)
        return problem.prompt, self.demonstrate(problem, rng, self.skill if skill else self.mixture)


def _rows(problems: Sequence[Any], *, prefix: str) -> list[dict[str, Any]]:
    return [
        {"task_id": f"{prefix}-{i:05d}", "task_type": TASK_TYPE, "prompt": p.prompt,
         "data": json.loads(p.task_data())}
        for i, p in enumerate(problems)
    ]
