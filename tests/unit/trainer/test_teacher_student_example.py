"""The miniature teacher-student task: the expert solves it, splits are disjoint, and DAgger's
rows put the teacher's label on the student's state."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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


def _load_run() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "examples" / "teacher_student" / "run.py"
    spec = importlib.util.spec_from_file_location("teacher_student_run", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_teacher_never_trains_on_a_held_out_task(tmp_path: Path, monkeypatch: Any) -> None:
    """Held-out success means tasks no policy trained on: the teacher's expert roll-outs start
    only from training tasks."""
    run = _load_run()
    started: list[tuple[int, int]] = []
    original = cd.Episode.start.__func__  # type: ignore[attr-defined]

    def recording(cls: type, task: tuple[int, int]) -> cd.Episode:
        started.append(tuple(task))  # type: ignore[arg-type]
        return original(cls, task)  # type: ignore[no-any-return]

    monkeypatch.setattr(cd.Episode, "start", classmethod(recording))
    monkeypatch.setattr(run, "train_steps", lambda *args, **kwargs: 0)  # the data is the point
    run.train_teacher(tmp_path)
    assert len(started) == 400
    assert set(started) <= set(cd.tasks("train")), "the teacher saw held-out tasks"


def test_budgets_count_effective_supervised_tokens() -> None:
    """`train_steps` reports the loss-masked target tokens it trained on (one per action here),
    the budget the table compares besides episodes and steps."""
    import random

    from stacx.trainer import InMemoryBatchSource, StacxTrainer
    from stacx.trainer.testing import tiny_trainer_config

    run = _load_run()
    episodes = []
    for task in cd.tasks("train")[:3]:
        e = cd.Episode.start(task)
        while not e.done:
            e.labels.append(cd.expert_action(e.x, e.goal))
            e.actors.append("expert")
            e.step(e.labels[-1])
        episodes.append(e)
    data = [[run.to_trajectory(e, f"budget-{k}")] for k, e in enumerate(episodes)]
    trainer = StacxTrainer(tiny_trainer_config("sft"), source=InMemoryBatchSource([]))
    tokens = run.train_steps(trainer, data, 2, random.Random(0))
    trainer.close()
    assert tokens == 2 * sum(len(e.actions) for e in episodes)
