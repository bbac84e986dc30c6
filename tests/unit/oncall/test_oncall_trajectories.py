"""The prefix-merge rule: which calls make one trajectory, what is masked, why a new one starts."""

from __future__ import annotations

import numpy as np
import pytest
from oncall_fixtures import call

from stacx.consumers.oncall import TrajectoryBuilder, interaction_split, trajectory_id_for


def test_calls_extending_prompt_plus_completion_merge_with_tool_turns_masked() -> None:
    builder = TrajectoryBuilder()
    first = call("s", "c1", [1, 2, 3], [10, 11])
    second = call("s", "c2", [1, 2, 3, 10, 11, 50, 51], [12])  # + tool result 50 51
    traj, closed = builder.add(None, first)
    traj, closed = builder.add(traj, second)
    assert closed is None and builder.num_merged == 1
    assert traj.token_ids == [1, 2, 3, 10, 11, 50, 51, 12]
    assert traj.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert traj.logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5]
    assert traj.prompt_length == 3 and traj.interaction_ids == ["c1", "c2"]
    assert builder.reasons["session_start"] == 1
    record = traj.to_trajectory(sample_index=0, reward=1.0, rewards={"user": 1.0}, metadata={})
    assert record.trajectory_id == trajectory_id_for("s", "c1")
    assert np.array_equal(record.loss_mask, np.array(traj.loss_mask, dtype=np.uint8))
    assert record.metadata["interaction_ids"] == "c1,c2"


@pytest.mark.parametrize(
    ("prompt", "reason"),
    [
        ([1, 2, 9, 10, 11, 50], "history_changed"),  # an earlier turn edited
        ([1, 2, 3, 10, 99, 50], "response_rerendered"),  # the answer came back re-serialised
        ([1, 2, 3, 77], "response_rerendered"),  # another sample of the same prompt
        ([5, 6], "history_changed"),  # another conversation, same session id
    ],
)
def test_a_prompt_that_does_not_extend_starts_a_new_trajectory_with_its_reason(
    prompt: list[int], reason: str
) -> None:
    builder = TrajectoryBuilder()
    traj, _ = builder.add(None, call("s", "c1", [1, 2, 3], [10, 11]))
    fresh, closed = builder.add(traj, call("s", "c2", prompt, [12]))
    assert closed is traj and fresh is not traj
    assert fresh.token_ids == [*prompt, 12] and fresh.start_reason == reason
    assert builder.reasons[reason] == 1


def test_model_change_and_length_limit_start_new_trajectories() -> None:
    builder = TrajectoryBuilder(max_tokens=8)
    traj, _ = builder.add(None, call("s", "c1", [1, 2], [3]))
    traj2, closed = builder.add(traj, call("s", "c2", [1, 2, 3, 4], [5], model="other"))
    assert closed is traj and builder.reasons["model_changed"] == 1
    traj3, closed = builder.add(traj2, call("s", "c3", [1, 2, 3, 4, 5, 6, 7, 8], [9], model="other"))
    assert closed is traj2 and builder.reasons["max_length"] == 1 and traj3.token_ids[-1] == 9


def test_inconsistent_events_are_refused() -> None:
    bad = call("s", "c1", [1, 2], [3])
    bad.metadata["prompt_length"] = "7"
    with pytest.raises(ValueError, match="prompt_length"):
        interaction_split(bad)


def test_a_temperature_change_starts_a_new_trajectory_at_the_new_temperature() -> None:
    builder = TrajectoryBuilder()
    hot = call("s", "c1", [1, 2, 3], [10, 11])
    cool = call("s", "c2", [1, 2, 3, 10, 11, 50], [12])  # extends the prompt, sampled at 0.3
    cool.metadata["temperature"] = "0.3"
    traj, _ = builder.add(None, hot)
    fresh, closed = builder.add(traj, cool)
    assert closed is traj and closed.interaction_ids == ["c1"] and closed.temperature == 1.0
    assert fresh.interaction_ids == ["c2"] and fresh.start_reason == "temperature_changed"
    assert builder.reasons["temperature_changed"] == 1 and builder.num_merged == 0
    record = fresh.to_trajectory(sample_index=1, reward=0.0, rewards={}, metadata={})
    assert record.temperature == pytest.approx(0.3)
    # the same temperature (however written) still merges
    same = call("s", "c3", [1, 2, 3, 10, 11, 50, 12, 60], [13])
    same.metadata["temperature"] = "0.30"
    merged, closed = builder.add(fresh, same)
    assert closed is None and merged is fresh and merged.interaction_ids == ["c2", "c3"]


def test_trajectory_ids_are_32_hex_digits_of_the_session_and_first_call() -> None:
    tid = trajectory_id_for("s", "c1")
    assert len(tid) == 32 and int(tid, 16) >= 0
    assert tid == trajectory_id_for("s", "c1") != trajectory_id_for("s", "c2")


def test_without_prompt_length_the_prompt_is_the_masked_prefix() -> None:
    event = call("s", "c1", [1, 2], [3, 4])
    del event.metadata["prompt_length"]
    event.loss_mask = np.array([0, 0, 1, 0], dtype=np.uint8)  # a masked token inside the answer
    assert interaction_split(event) == ([1, 2], [3, 4], [-0.5, -0.5])
    event.loss_mask = np.array([0, 0, 0, 0], dtype=np.uint8)  # nothing generated: all prompt
    assert interaction_split(event) == ([1, 2, 3, 4], [], [])


def test_prompt_length_bounds_and_logprob_count_are_checked() -> None:
    event = call("s", "c1", [1, 2], [3])
    event.metadata["prompt_length"] = "3"  # all prompt: allowed
    assert interaction_split(event) == ([1, 2, 3], [], [])
    event.metadata["prompt_length"] = "0"
    with pytest.raises(ValueError, match="prompt_length 0 does not fit 3 token ids"):
        interaction_split(event)
    event.metadata["prompt_length"] = "2"
    event.logprobs = np.array([0.0, -1.0], dtype=np.float32)
    with pytest.raises(ValueError, match="^2 logprobs for 3 token ids$"):
        interaction_split(event)
    event.logprobs = np.array([], dtype=np.float32)  # no logprobs logged: zeros
    assert interaction_split(event) == ([1, 2], [3], [0.0])


def test_max_tokens_bounds() -> None:
    assert TrajectoryBuilder(max_tokens=1).max_tokens == 1
    with pytest.raises(ValueError, match="^max_tokens=0: a trajectory needs at least one token$"):
        TrajectoryBuilder(max_tokens=0)
    builder = TrajectoryBuilder()  # 32,768 tokens by default: exactly that many still merge
    traj, _ = builder.add(None, call("s", "c1", [1, 2], [3]))
    long_prompt = [1, 2, 3, *range(4, 32_768)]
    traj, closed = builder.add(traj, call("s", "c2", long_prompt, [7]))
    assert closed is None and len(traj.token_ids) == 32_768
    _, closed = builder.add(traj, call("s", "c3", list(traj.token_ids), [9]))  # 32,769: one too many
    assert closed is traj and builder.reasons["max_length"] == 1


def test_merges_and_reasons_are_counted_not_set() -> None:
    builder = TrajectoryBuilder()
    traj, _ = builder.add(None, call("s", "c1", [1], [2]))
    traj, _ = builder.add(traj, call("s", "c2", [1, 2, 3], [4]))
    traj, _ = builder.add(traj, call("s", "c3", [1, 2, 3, 4, 5], [6]))
    assert builder.num_merged == 2
    traj, _ = builder.add(traj, call("s", "c4", [9], [1]))
    builder.add(traj, call("s", "c5", [8], [1]))
    assert builder.reasons["history_changed"] == 2 and builder.reasons["session_start"] == 1


def test_the_episode_id_becomes_the_task_id() -> None:
    with_episode = call("s", "c1", [1], [2])
    with_episode.metadata["episode_id"] = "ep-7"
    traj, _ = TrajectoryBuilder().add(None, with_episode)
    assert traj.episode_id == "ep-7"
    assert traj.to_trajectory(sample_index=0, reward=0.0, rewards={}, metadata={}).task_id == "ep-7"
    plain, _ = TrajectoryBuilder().add(None, call("s", "c1", [1], [2]))
    assert plain.episode_id == ""
    assert plain.to_trajectory(sample_index=0, reward=0.0, rewards={}, metadata={}).task_id == "s"


@pytest.mark.parametrize(
    ("written", "temperature"),
    [(None, 1.0), ("", 1.0), ("warm", 1.0), ("0", 1.0), ("-0.5", 1.0), ("0.7", 0.7)],
)
def test_greedy_or_unknown_temperatures_mean_one(written: str | None, temperature: float) -> None:
    event = call("s", "c1", [1], [2])
    if written is None:
        del event.metadata["temperature"]
    else:
        event.metadata["temperature"] = written
    traj, _ = TrajectoryBuilder().add(None, event)
    assert traj.temperature == pytest.approx(temperature)
