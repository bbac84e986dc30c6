"""A held-out evaluation is stamped with the versions that generated it, not the one at submit."""

from __future__ import annotations

from stacx.infra.pipeline.evaluation import versions_used
from stacx.schemas.records import Trajectory, Turn


def _episode(*versions: int | None) -> Trajectory:
    turns = [Turn(role="user", text="q")]
    turns += [Turn(role="assistant", text="a", policy_version=v) for v in versions]
    return Trajectory(
        trajectory_id="t", group_id="g", sample_index=0, task_id="t", task_type="math",
        model_name="policy", policy_version=4, turns=turns,
    )


def test_the_versions_are_the_oldest_and_newest_that_generated_a_turn() -> None:
    # submitted at v4; the server swapped to v5 and v7 during the evaluation
    assert versions_used([_episode(4, 5), _episode(7), _episode(None)], default=4) == (4, 7)
    assert versions_used([_episode(6, 7)], default=4) == (6, 7)


def test_without_versions_on_the_turns_the_submit_version_stands() -> None:
    assert versions_used([_episode(None)], default=3) == (3, 3)
    assert versions_used([], default=3) == (3, 3)
