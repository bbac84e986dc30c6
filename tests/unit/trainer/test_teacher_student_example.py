"""The miniature teacher-student task: the expert solves it, splits are disjoint, and DAgger's
rows put the teacher's label on the student's state."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "teacher_student"))

import corridor as cd  # noqa: E402


def test_splits_are_disjoint_and_the_expert_solves_every_task() -> None:
    train, heldout = cd.tasks("train"), cd.tasks("heldout")
    assert train and heldout and not set(train) & set(heldout)
    for task in train + heldout:
        e = cd.Episode.start(task)
        while not e.done:
            e.step(cd.expert_action(e.x, e.goal))
        assert e.success and len(e.actions) == abs(task[1] - task[0])


def test_a_wrong_step_and_an_invalid_token_end_as_failures() -> None:
    e = cd.Episode.start((5, 7))  # distance 2, horizon 4
    for action in (cd.LEFT, cd.LEFT, cd.RIGHT, cd.RIGHT):
        e.step(action)
    assert e.done and not e.success and e.x == 5
    bad = cd.Episode.start((5, 7))
    bad.step(40)
    assert bad.done and not bad.success


def test_play_labels_every_state_with_the_teachers_greedy_action() -> None:
    class Scripted(torch.nn.Module):
        """Always prefers `token`."""

        def __init__(self, token: int) -> None:
            super().__init__()
            self.token = token

        def forward(self, ids, mask):  # type: ignore[no-untyped-def]
            logits = torch.full((*ids.shape, 64), -10.0)
            logits[..., self.token] = 10.0
            return type("Out", (), {"logits": logits})()

    episodes = cd.play(Scripted(cd.LEFT), [(3, 8)], greedy=True, gen=torch.Generator(),
                       teacher=Scripted(cd.RIGHT), beta=0.0)
    (e,) = episodes
    assert [e.ids[a] for a in e.actions] == [cd.LEFT] * e.horizon  # the student acted
    assert e.labels == [cd.RIGHT] * e.horizon and set(e.actors) == {"student"}
