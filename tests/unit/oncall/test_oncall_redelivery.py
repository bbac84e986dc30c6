"""At-least-once input to the feedback join: redelivered feedback and calls change nothing."""

from __future__ import annotations

from oncall_fixtures import call, rating

from stacx.consumers.oncall import FeedbackJoin, Joined, Rejected

WINDOW_S = 60.0
T0 = 1_000_000


def _join(**config: object) -> FeedbackJoin:
    return FeedbackJoin(FeedbackJoin.Config(window_s=WINDOW_S, **config), {})  # type: ignore[arg-type]


def test_feedback_redelivered_twice_is_neither_dead_lettered_nor_joined_again() -> None:
    join = _join()
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    feedback = rating("s", 1.0, at_ms=T0 + 1_000)
    (joined,) = join.on_feedback(feedback, "f1")
    assert isinstance(joined, Joined)
    assert join.on_feedback(feedback, "f1") == []
    assert join.on_feedback(feedback, "f1") == []
    assert join.stats.feedback == 3 and join.stats.feedback_joined == 1
    assert join.stats.feedback_late == 0 and join.stats.trajectories_rewarded == 1


def test_feedback_redelivered_inside_the_window_is_counted_once_in_the_combined_reward() -> None:
    join = _join(wait_for_window=True)
    join.on_interaction(call("s", "c1", [1, 2], [3], at_ms=T0))
    liked, disliked = rating("s", 1.0, at_ms=T0 + 1_000), rating("s", 0.0, at_ms=T0 + 2_000)
    for fid, feedback in (("f1", liked), ("f1", liked), ("f2", disliked), ("f1", liked)):
        assert join.on_feedback(feedback, fid) == []
    (joined,) = join.on_tick(T0 + 61_000)
    assert isinstance(joined, Joined)
    assert joined.trajectory.reward == 0.5 and joined.trajectory.metadata["feedback_ids"] == "f1,f2"
    assert join.stats.feedback_joined == 2


def test_a_call_redelivered_after_its_trajectory_was_emitted_starts_nothing() -> None:
    join = _join()
    first = call("s", "c1", [1, 2], [3], at_ms=T0)
    join.on_interaction(first)
    (joined,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 1_000), "f1")
    assert isinstance(joined, Joined)
    assert join.on_interaction(first) == []
    assert join.stats.duplicate_interactions == 1
    assert join.on_tick(T0 + 200_000) == []  # no second trajectory waits for feedback
    assert join.stats.unrewarded_dropped == 0 and join.stats.trajectories_rewarded == 1
    assert sum(join.stats.new_trajectory_reasons.values()) == 1


def test_a_call_redelivered_while_its_closed_trajectory_waits_for_feedback_is_skipped() -> None:
    join = _join()
    first = call("s", "c1", [1, 2], [3], at_ms=T0)
    join.on_interaction(first)
    join.on_interaction(call("s", "c2", [7, 8], [9], at_ms=T0 + 10))  # history changed: c1 closed
    assert join.on_interaction(first) == []
    assert join.stats.duplicate_interactions == 1
    (joined,) = join.on_feedback(rating("s", 1.0, at_ms=T0 + 20, interaction="c1"), "f1")
    assert isinstance(joined, Joined) and joined.trajectory.metadata["interaction_ids"] == "c1"
    results = join.on_tick(T0 + 200_000)
    assert not [r for r in results if isinstance(r, Rejected)]
    assert join.stats.unrewarded_dropped == 1  # c2 only: c1 was not opened a second time
