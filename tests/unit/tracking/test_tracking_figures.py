"""Per-version figures from a run's events, against values worked out by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stacx.infra.tracking import RunFigures
from stacx.infra.tracking.figures import SAMPLE_COLUMNS, figure_name
from stacx.schemas.records import (
    STEP_FIGURE_PREFIX,
    TrainingBatch,
    Trajectory,
    TrajectoryStatus,
    Turn,
    WeightVersion,
)


def _trajectory(
    n: int,
    version: int,
    reward: float,
    *,
    task_type: str = "math",
    tools: int = 0,
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED,
    generated: int = 2,
) -> Trajectory:
    turns = [
        Turn(role="user", text=f"What is {n}?"),
        Turn(role="assistant", text="x" * 500),
        Turn(role="tool", text="ok"),
        Turn(role="assistant", text=f"answer {n}"),
    ]
    return Trajectory(
        trajectory_id=f"t{n}",
        group_id="g",
        sample_index=n,
        task_id=f"task{n}",
        task_type=task_type,
        model_name="policy",
        policy_version=version,
        turns=turns,
        token_ids=np.arange(6, dtype=np.int32),
        loss_mask=np.array([0] * (6 - generated) + [1] * generated, np.uint8),
        reward=reward,
        rewards={"correct": reward, "format": 1.0},
        status=status,
        metadata={"num_tool_calls": str(tools)},
    )


def _weights(version: int, **figures: float) -> WeightVersion:
    metadata = {STEP_FIGURE_PREFIX + k: repr(v) for k, v in figures.items()}
    return WeightVersion(
        model_name="policy",
        version=version,
        path="/w",
        metadata={**metadata, "recipe": "grpo", "batch_id": "b"},
    )


def _batch(versions: list[int], rewards: list[float]) -> TrainingBatch:
    n = len(versions)
    ints = np.zeros(n, np.int32)
    return TrainingBatch(
        batch_id="b",
        model_name="policy",
        trajectory_ids=[f"t{i}" for i in range(n)],
        group_ids=["g"] * n,
        task_types=["math"] * n,
        policy_versions=np.array(versions, np.int32),
        offsets=ints,
        lengths=ints,
        prompt_lengths=ints,
        token_ids=np.zeros(0, np.int32),
        loss_mask=np.zeros(0, np.uint8),
        logprobs=np.zeros(0, np.float32),
        rewards=np.array(rewards, np.float32),
    )


def test_a_version_gets_its_trainer_figures_on_arrival_and_its_rollout_figures_once_settled() -> None:
    figures = RunFigures(settle_versions=2, samples_per_version=1)
    for n, reward in enumerate([1.0, 0.0, 1.0, 1.0]):
        figures.observe_trajectory(_trajectory(n, 0, reward, tools=n % 2), 1000 + n)
    figures.observe_batch(_batch([0, 0], [1.0, 0.0]))

    (trainer,) = figures.observe_weights(
        _weights(1, loss=0.5, num_tokens=100.0, seconds=4.0, **{"policy/kl": 0.01}), 2000
    )
    assert trainer.step == 1 and trainer.table is None
    assert trainer.metrics == {
        "trainer/loss": 0.5,
        "trainer/num_tokens": 100.0,
        "trainer/seconds": 4.0,
        "trainer/policy/kl": 0.01,
        "trainer/tokens_per_s": 25.0,
        "assembler/batches": 1.0,
        "assembler/batch_staleness_mean": 0.0,
        "assembler/batch_reward_mean": 0.5,
    }
    figures.observe_trajectory(
        _trajectory(9, 0, 0.0, status=TrajectoryStatus.FAILED), 2500
    )  # late, not yet settled

    trainer2, rollout0 = figures.observe_weights(_weights(2, loss=0.25), 4000)
    assert trainer2.step == 2 and trainer2.metrics["assembler/batches"] == 0.0
    assert trainer2.metrics["perf/episodes_per_s"] == pytest.approx(1 / 2.0)  # one in 2 s
    assert rollout0.step == 0
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0]
    assert rollout0.metrics["rollout/episodes"] == 5
    assert rollout0.metrics["rollout/reward_mean"] == pytest.approx(np.mean(rewards))
    assert rollout0.metrics["rollout/reward_std"] == pytest.approx(np.std(rewards))
    assert rollout0.metrics["rollout/math/reward_mean"] == pytest.approx(0.6)
    assert rollout0.metrics["rollout/success"] == pytest.approx(3 / 5)
    assert rollout0.metrics["rollout/tool_use_rate"] == pytest.approx(2 / 5)
    assert rollout0.metrics["rollout/failed_rate"] == pytest.approx(1 / 5)
    assert rollout0.metrics["rollout/turns_mean"] == 2.0
    assert rollout0.metrics["rollout/generated_tokens_mean"] == 2.0
    assert rollout0.metrics["rollout/staleness_mean"] == pytest.approx(1 / 5)  # the late one came at v1
    assert rollout0.metrics["rollout/staleness_max"] == 1.0
    assert rollout0.metrics["rollout/rewards/correct_mean"] == pytest.approx(0.6)
    assert rollout0.metrics["rollout/rewards/format_mean"] == 1.0
    assert rollout0.table is not None and list(rollout0.table.columns) == list(SAMPLE_COLUMNS)
    (row,) = rollout0.table.rows
    assert row[:7] == ["t0", "task0", "math", 1.0, "COMPLETED", 2, 2]
    assert row[7] == "What is 0?" and row[8] == "answer 0"


def test_each_task_type_gets_its_own_reward_series() -> None:
    figures = RunFigures(settle_versions=1)
    figures.observe_trajectory(_trajectory(0, 0, 1.0, task_type="math"))
    figures.observe_trajectory(_trajectory(1, 0, 0.0, task_type="code:python"))
    figures.observe_trajectory(_trajectory(2, 0, 0.5, task_type="code:python"))
    _, rollout = figures.observe_weights(_weights(1))
    assert rollout.metrics["rollout/math/reward_mean"] == 1.0
    assert rollout.metrics["rollout/code_python/reward_mean"] == 0.25  # ':' is not a name MLflow takes
    assert rollout.metrics["rollout/code_python/reward_std"] == 0.25
    assert rollout.metrics["rollout/code_python/episodes"] == 2


def test_an_episode_after_its_version_was_logged_revises_its_row_and_a_redelivery_counts_once() -> None:
    figures = RunFigures(settle_versions=1)
    figures.observe_trajectory(_trajectory(0, 0, 1.0), 10)
    figures.observe_trajectory(_trajectory(0, 0, 1.0), 11)  # the same event again (at-least-once)
    _, rollout = figures.observe_weights(_weights(1), 20)
    assert rollout.metrics["rollout/episodes"] == 1 and rollout.table is not None
    figures.observe_trajectory(_trajectory(1, 0, 0.0), 30)  # a straggler of v0
    assert figures.num_revised == 1
    (revised,) = figures.flush()
    assert revised.step == 0 and revised.table is None  # the table went with the first row
    assert revised.metrics["rollout/episodes"] == 2
    assert revised.metrics["rollout/reward_mean"] == 0.5
    assert revised.metrics["rollout/staleness_mean"] == 0.5  # the straggler came when v1 was live
    assert figures.flush() == []  # nothing changed since


def test_a_straggler_is_revised_in_at_the_next_version_too() -> None:
    figures = RunFigures(settle_versions=1)
    figures.observe_trajectory(_trajectory(0, 0, 1.0), 10)
    figures.observe_weights(_weights(1), 20)
    figures.observe_trajectory(_trajectory(1, 0, 0.0), 30)
    figures.observe_trajectory(_trajectory(2, 1, 1.0), 31)
    trainer, revised, rollout1 = figures.observe_weights(_weights(2), 40)
    assert (revised.step, revised.metrics["rollout/episodes"]) == (0, 2.0)
    assert (rollout1.step, rollout1.metrics["rollout/episodes"]) == (1, 1.0)


def test_staleness_is_counted_against_the_version_live_at_arrival_not_the_newest_settled() -> None:
    figures = RunFigures(settle_versions=3)
    figures.note_published(1, 100)  # read off the weights topic, not settled yet
    figures.note_published(2, 200)
    figures.observe_trajectory(_trajectory(0, 0, 1.0), 150)  # v1 live: 1 behind
    figures.observe_trajectory(_trajectory(1, 0, 1.0), 250)  # v2 live: 2 behind
    figures.observe_trajectory(_trajectory(2, 0, 1.0), 50)  # v0 live: fresh
    (row,) = figures.flush()
    assert row.metrics["rollout/staleness_mean"] == pytest.approx(1.0)
    assert row.metrics["rollout/staleness_max"] == 2.0


def test_response_lengths_and_truncation_follow_verl_names() -> None:
    figures = RunFigures(settle_versions=1)
    figures.observe_trajectory(_trajectory(0, 0, 1.0, generated=1), 1)
    figures.observe_trajectory(_trajectory(1, 0, 1.0, generated=5, status=TrajectoryStatus.TRUNCATED), 2)
    (row,) = figures.flush()
    assert row.metrics["rollout/response_length/mean"] == 3.0
    assert row.metrics["rollout/response_length/max"] == 5.0
    assert row.metrics["rollout/response_length/min"] == 1.0
    assert row.metrics["rollout/response_length/clip_ratio"] == 0.5


def test_flush_logs_every_version_left_in_order_and_a_reannounced_version_nothing() -> None:
    figures = RunFigures(settle_versions=5)
    for n, version in enumerate([2, 0, 1]):
        figures.observe_trajectory(_trajectory(n, version, 1.0))
    assert len(figures.observe_weights(_weights(2))) == 1  # nothing settled yet
    assert figures.observe_weights(_weights(2)) == []  # announced again after a trainer restart
    assert figures.observe_weights(_weights(1)) == []
    assert [p.step for p in figures.flush()] == [0, 1, 2]


def test_the_assembler_filter_decides_the_dropped_rate() -> None:
    figures = RunFigures(settle_versions=1, keeps=lambda t, newest: t.reward > 0)
    figures.observe_trajectory(_trajectory(0, 0, 1.0))
    figures.observe_trajectory(_trajectory(1, 0, 0.0))
    _, rollout = figures.observe_weights(_weights(1))
    assert rollout.metrics["assembler/dropped_rate"] == 0.5


def test_figure_names_keep_only_what_every_tracker_takes() -> None:
    assert figure_name("policy/kl") == "policy/kl"
    assert figure_name("a:b@c") == "a_b_c"


def test_the_assembly_wait_runs_from_a_batchs_newest_trajectory_to_the_batch() -> None:
    figures = RunFigures(settle_versions=1)
    figures.observe_trajectory(_trajectory(0, 0, 1.0), 1000)
    figures.observe_trajectory(_trajectory(1, 0, 1.0), 3000)
    figures.observe_batch(_batch([0, 0], [1.0, 1.0]), 3500)  # t0, t1
    figures.observe_batch(_batch([0], [1.0]), 2000)  # t0 only
    trainer, _ = figures.observe_weights(_weights(1), 4000)
    assert trainer.metrics["assembler/wait_s_mean"] == pytest.approx((0.5 + 1.0) / 2)


def test_the_episode_time_comes_from_the_rollouts_duration_metadata() -> None:
    figures = RunFigures(settle_versions=1)
    for n, ms in enumerate(["1500", "2500", "not a number"]):
        t = _trajectory(n, 0, 1.0)
        figures.observe_trajectory(dataclasses.replace(t, metadata={**t.metadata, "duration_ms": ms}), n)
    (row,) = figures.flush()
    assert row.metrics["rollout/episode_s_mean"] == 2.0 and row.metrics["rollout/episode_s_max"] == 2.5


def test_the_publish_to_swap_time_of_each_version_once_both_are_known() -> None:
    figures = RunFigures(settle_versions=1)
    figures.note_swap(1, 2600)  # seen before the feed read the weights event
    assert figures.swap_points() == []
    figures.note_published(1, 2000)
    figures.note_published(2, 5000)
    (point,) = figures.swap_points()
    assert (point.step, point.metrics) == (1, {"perf/publish_to_swap_s": 0.6})
    figures.note_swap(1, 9000)  # seen again later: the first sighting counts
    figures.note_swap(2, 5250)
    assert [(p.step, p.metrics["perf/publish_to_swap_s"]) for p in figures.swap_points()] == [(2, 0.25)]
    assert figures.swap_points() == []
