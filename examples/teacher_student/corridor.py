"""The synthetic multi-turn task: walk a corridor to a goal, one action token per turn.

A row of tokens is `[BOS, GOAL_g, POS_x0, a1, POS_x1, a2, POS_x2, ...]`: the prompt names the
goal cell g and the start x0; each turn the agent emits LEFT or RIGHT (any other token is an
invalid action and ends the episode) and the environment answers with the new position. The
episode succeeds when x reaches g within |g - x0| + SLACK turns, so a few wrong steps compound
into a failure, and a wrong step leads to states the expert never visits (the covariate shift
DAgger is about). Tasks (x0, g) split into training and held-out ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

BOS, LEFT, RIGHT = 1, 2, 3
POS0, GOAL0 = 8, 32
WIDTH = 16
SLACK = 2
MIN_DISTANCE, MAX_DISTANCE = 2, 7
PROMPT_LENGTH = 3


def expert_action(x: int, goal: int) -> int:
    return RIGHT if goal > x else LEFT


def held_out(task: tuple[int, int]) -> bool:
    return (task[0] + 2 * task[1]) % 5 == 0


def tasks(split: str) -> list[tuple[int, int]]:
    """(x0, g) pairs of the split: `train` or `heldout`."""
    every = [(x, g) for x in range(WIDTH) for g in range(WIDTH)
             if MIN_DISTANCE <= abs(g - x) <= MAX_DISTANCE]
    return [t for t in every if held_out(t) == (split == "heldout")]


@dataclass(slots=True)
class Episode:
    """One episode's tokens and, per turn, what the teacher said and who acted."""

    x0: int
    goal: int
    ids: list[int] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    """Index in `ids` of every executed action token."""
    labels: list[int] = field(default_factory=list)
    """The teacher's action at each turn's state (DAgger labels)."""
    actors: list[str] = field(default_factory=list)
    x: int = 0
    done: bool = False
    success: bool = False

    @classmethod
    def start(cls, task: tuple[int, int]) -> Episode:
        x0, g = task
        return cls(x0=x0, goal=g, ids=[BOS, GOAL0 + g, POS0 + x0], x=x0)

    @property
    def horizon(self) -> int:
        return abs(self.goal - self.x0) + SLACK

    def step(self, action: int) -> None:
        """Execute one action token; the episode ends on the goal, an invalid token or the horizon."""
        self.actions.append(len(self.ids))
        self.ids.append(action)
        if action not in (LEFT, RIGHT):
            self.done = True
            return
        self.x = min(max(self.x + (1 if action == RIGHT else -1), 0), WIDTH - 1)
        self.ids.append(POS0 + self.x)
        self.success = self.x == self.goal
        self.done = self.success or len(self.actions) >= self.horizon


@torch.no_grad()
def next_tokens(model: torch.nn.Module, episodes: list[Episode], *, greedy: bool,
                gen: torch.Generator) -> list[int]:
    """One token per (unfinished, equally long) episode from the model's next-token distribution."""
    ids = torch.tensor([e.ids for e in episodes])
    logits = model(ids, torch.ones_like(ids)).logits[:, -1].float()  # [B, V]
    if greedy:
        return logits.argmax(-1).tolist()
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1).tolist()


def play(actor: torch.nn.Module, task_list: list[tuple[int, int]], *, greedy: bool,
         gen: torch.Generator, teacher: torch.nn.Module | None = None, beta: float = 0.0,
         coin: random.Random | None = None) -> list[Episode]:
    """Episodes of `task_list` played by `actor`; with a `teacher`, each state also gets the
    teacher's greedy action as its label, and with probability `beta` the teacher acts."""
    episodes = [Episode.start(t) for t in task_list]
    coin = coin or random.Random(0)
    while True:
        live = [e for e in episodes if not e.done]
        if not live:
            return episodes
        by_length: dict[int, list[Episode]] = {}
        for e in live:
            by_length.setdefault(len(e.ids), []).append(e)
        for group in by_length.values():
            own = next_tokens(actor, group, greedy=greedy, gen=gen)
            labels = next_tokens(teacher, group, greedy=True, gen=gen) if teacher else own
            for e, a, label in zip(group, own, labels, strict=True):
                teacher_acts = teacher is not None and coin.random() < beta
                e.labels.append(label)
                e.actors.append("teacher" if teacher_acts else "student")
                e.step(label if teacher_acts else a)


def success_rate(model: torch.nn.Module, task_list: list[tuple[int, int]]) -> float:
    """Greedy success rate on `task_list`."""
    episodes = play(model, task_list, greedy=True, gen=torch.Generator().manual_seed(0))
    return sum(e.success for e in episodes) / len(episodes)
