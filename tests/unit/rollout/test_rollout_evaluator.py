"""Evaluator: exact tokens, loss masks, logprobs, versions, and failures that never escape."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, ScriptedInference
from stacx.rollout.protocols import ExecResult, TaskGroup
from stacx.rollout.resources import LocalPool, ResourcePool, Resources
from stacx.schemas.records import TaskSample, TrajectoryStatus

BUDGET = Resources(sandboxes=4, cpu=4, memory_mb=4096, generations=2)


def _group(task_type: str = "math", data: str = '{"answer": 42}') -> TaskGroup:
    task = TaskSample(task_id="t1", task_type=task_type, prompt="What is 6*7?", data=data)
    return TaskGroup(group_id="g1", task=task, num_samples=1)


def _script(*texts: str):
    return lambda context, call: texts[min(call, len(texts) - 1)]


async def _run(evaluator: Evaluator, group: TaskGroup | None = None, version: int = 0):
    async with LocalPool.drawn(evaluator.global_pool, evaluator.demand.local_pool, name="ep") as lp:
        return await evaluator.run(group or _group(), 0, lp, policy_version=version)


def _evaluator(inference, envs=None, tokenizer=None, **options) -> Evaluator:
    config = Evaluator.Config(**options)
    return Evaluator(
        config,
        name="math",
        tokenizer=tokenizer or inference.tokenizer,
        inference=inference,
        environments=envs if envs is not None else FakeEnvironments(),
        global_pool=ResourcePool(BUDGET),
    )


async def test_retool_episode_has_exact_tokens_mask_logprobs_and_reward() -> None:
    tok = FakeTokenizer()
    inference = ScriptedInference(
        tok, _script("<tool_call>print(6*7)</tool_call>", "The tool says <answer>42</answer>")
    )
    envs = FakeEnvironments()
    traj = await _run(_evaluator(inference, envs), version=3)

    roles = [t.role for t in traj.turns]
    assert roles == ["user", "assistant", "tool", "assistant"]
    prompt, gen1, obs, gen2 = (list(t.token_ids) for t in traj.turns)
    assert list(traj.token_ids) == prompt + gen1 + obs + gen2
    assert traj.prompt_length == len(prompt)
    expected_mask = [0] * len(prompt) + [1] * len(gen1) + [0] * len(obs) + [1] * len(gen2)
    assert list(traj.loss_mask) == expected_mask
    lp = [-(k + 1) / 100 for k in range(len(gen1))]
    np.testing.assert_allclose(traj.logprobs[len(prompt) : len(prompt) + len(gen1)], lp, rtol=1e-6)
    assert np.all(traj.logprobs[traj.loss_mask == 0] == 0.0)
    assert tok.decode(obs) == "\n<tool_response>\n42\n\n</tool_response>\n"
    assert traj.turns[1].tool_calls[0].name == "python"
    assert traj.reward == 1.0 and traj.status is TrajectoryStatus.COMPLETED
    assert traj.policy_version == 3 and traj.metadata["num_tool_calls"] == "1"
    assert envs.sessions[0].commands == ["python3 -"] and envs.open_sessions == []
    # the model saw exactly the accumulated context on its second call
    assert inference.calls[1][0] == prompt + gen1 + obs
    assert inference.calls[0][1].stop == ["</tool_call>"]


async def test_generated_ids_are_kept_as_generated_not_retokenised() -> None:
    tok = FakeTokenizer()  # has a single token for "42"
    inference = ScriptedInference(tok, _script("<answer>42</answer>"), split_ids=True)
    traj = await _run(_evaluator(inference, reward="exact_answer"))
    generated = list(traj.turns[1].token_ids)
    assert generated == [ord(c) for c in "<answer>42</answer>"] + [tok.vocab["<|im_end|>"]]
    assert tok.encode(tok.decode(generated)) != generated, "test needs a lossy round trip"
    assert list(traj.token_ids[traj.prompt_length :]) == generated
    assert traj.reward == 1.0


async def test_per_turn_policy_versions_follow_the_server() -> None:
    tok = FakeTokenizer()
    versions = iter([5, 6])
    inference = ScriptedInference(
        tok, _script("<tool_call>print(1)</tool_call>", "<answer>1</answer>"), version=lambda: next(versions)
    )
    traj = await _run(_evaluator(inference), version=5)
    assert [t.policy_version for t in traj.turns if t.role == "assistant"] == [5, 6]
    assert traj.policy_version == 5


async def test_unparseable_output_scores_zero_with_a_reason() -> None:
    tok = FakeTokenizer()
    inference = ScriptedInference(tok, _script("I think it is forty-two"))
    traj = await _run(_evaluator(inference))
    assert traj.reward == 0.0 and traj.status is TrajectoryStatus.COMPLETED
    assert "no <tool_call>" in traj.metadata["reward_reason"]


@pytest.mark.parametrize("garbage", ["<tool_call></tool_call>", "\\boxed{", "<answer>", "\x00\udcff"])
async def test_garbage_never_raises(garbage: str) -> None:
    inference = ScriptedInference(FakeTokenizer(), _script(garbage))
    traj = await _run(_evaluator(inference, max_turns=2))
    assert traj.status in (TrajectoryStatus.COMPLETED, TrajectoryStatus.TRUNCATED)
    assert traj.reward == 0.0


async def test_environment_failure_gives_failed_trajectory_and_closes_sandbox() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<tool_call>print(1)</tool_call>"))
    envs = FakeEnvironments(fail_exec=True)
    evaluator = _evaluator(inference, envs)
    traj = await _run(evaluator)
    assert traj.status is TrajectoryStatus.FAILED
    assert "EnvironmentStepError" in (traj.error or "") and "gateway unreachable" in traj.error
    assert envs.open_sessions == [] and evaluator.global_pool.in_use == Resources()


async def test_sandbox_create_failure_is_failed() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<answer>1</answer>"))
    traj = await _run(_evaluator(inference, FakeEnvironments(fail_open=True)))
    assert traj.status is TrajectoryStatus.FAILED and "sandbox create failed" in (traj.error or "")


async def test_inference_failure_gives_failed_trajectory() -> None:
    class Broken(ScriptedInference):
        async def generate(self, input_ids, params):  # type: ignore[no-untyped-def]
            raise ConnectionResetError("server went away")

    envs = FakeEnvironments()
    traj = await _run(_evaluator(Broken(FakeTokenizer(), _script("")), envs))
    assert traj.status is TrajectoryStatus.FAILED and "server went away" in (traj.error or "")
    assert envs.open_sessions == []


async def test_max_turns_truncates() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<tool_call>print(1)</tool_call>"))
    traj = await _run(_evaluator(inference, max_turns=3))
    assert traj.status is TrajectoryStatus.TRUNCATED and traj.metadata["stop_reason"] == "max_turns"
    assert sum(t.role == "assistant" for t in traj.turns) == 3


async def test_max_tokens_truncates_without_exceeding_it() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<tool_call>print(1)</tool_call>"))
    traj = await _run(_evaluator(inference, max_tokens=250, max_turns=50))
    assert traj.status is TrajectoryStatus.TRUNCATED
    assert len(traj.token_ids) <= 250
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)


async def test_per_turn_token_cut_is_truncated() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<tool_call>print(" + "1" * 50))
    traj = await _run(_evaluator(inference, max_new_tokens=20))
    assert traj.status is TrajectoryStatus.TRUNCATED and "token limit" in traj.metadata["reward_reason"]


async def test_episode_timeout_gives_timed_out_and_closes_sandbox() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<tool_call>print(1)</tool_call>"))
    envs = FakeEnvironments(delay_s=3600)
    traj = await _run(_evaluator(inference, envs, episode_timeout_s=0.05))
    assert traj.status is TrajectoryStatus.TIMED_OUT and "episode_timeout_s" in (traj.error or "")
    assert envs.open_sessions == []


async def test_cancellation_closes_sandbox_and_releases_pool() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<tool_call>print(1)</tool_call>"))
    envs = FakeEnvironments(delay_s=3600)
    evaluator = _evaluator(inference, envs)
    task = asyncio.create_task(_run(evaluator))
    while not envs.sessions or not envs.sessions[0].commands:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert envs.open_sessions == [] and evaluator.global_pool.in_use == Resources()


async def test_terminal_agent_observation_is_a_templated_user_message() -> None:
    tok = FakeTokenizer()
    inference = ScriptedInference(tok, _script("<command>ls</command>", "<done/>"), eos=True)
    envs = FakeEnvironments(handler=lambda cmd, stdin: ExecResult(exit_code=0, stdout="a.txt\n"))
    evaluator = _evaluator(inference, envs, scaffold="terminal", reward="verifier")
    traj = await _run(evaluator, _group("shell", "{}"))
    obs = tok.decode(traj.turns[2].token_ids)
    # the stop string ended the turn (no EOS generated), so the observation closes it first
    assert obs == "<|im_end|>\n<|im_start|>user\nexit code 0\na.txt\n<|im_end|>\n<|im_start|>assistant\n"
    assert envs.sessions[0].commands == ["ls"]
    assert traj.reward == 1.0 and traj.rewards == {"reward": 1.0}


async def test_single_turn_needs_no_sandbox() -> None:
    inference = ScriptedInference(FakeTokenizer(), _script("<answer>42</answer>"))
    config = Evaluator.Config(scaffold="single_turn", reward="exact_answer")
    evaluator = Evaluator(
        config,
        name="qa",
        tokenizer=inference.tokenizer,
        inference=inference,
        environments=None,
        global_pool=ResourcePool(BUDGET),
    )
    assert evaluator.demand.episode.sandboxes == 0
    traj = await _run(evaluator)
    assert traj.reward == 1.0 and sum(traj.loss_mask) == len(traj.turns[1].token_ids)


async def test_tool_response_framing_is_configurable() -> None:
    tok = FakeTokenizer()
    inference = ScriptedInference(tok, _script("<tool_call>print(6*7)</tool_call>", "<answer>42</answer>"))
    options = {"response_template": "<tool_response>{output}</tool_response>"}
    traj = await _run(_evaluator(inference, scaffold_options=options))
    assert traj.turns[2].text == "<tool_response>42\n</tool_response>"


class _Event:
    def __init__(self, value: object) -> None:
        self.value = value


class _WeightsConsumer:
    def __init__(self, values: list[object]) -> None:
        self.values = values
        self.closed = False
        self.committed: list[object] = []

    def commit(self, event: _Event) -> None:
        self.committed.append(event.value)

    def poll(self, timeout: float) -> _Event | None:
        if self.values:
            return _Event(self.values.pop(0))
        import time

        time.sleep(timeout)
        return None

    def close(self) -> None:
        self.closed = True


async def test_weights_follower_tracks_newest_version_of_its_model() -> None:
    from stacx.rollout.adapters import WeightsFollower
    from stacx.schemas.records import WeightVersion

    records = [
        WeightVersion(model_name="policy", version=2, path="/w/2"),
        WeightVersion(model_name="critic", version=9, path="/c/9"),
        WeightVersion(model_name="policy", version=1, path="/w/1"),
        WeightVersion(model_name="policy", version=4, path="/w/4"),
    ]
    consumer = _WeightsConsumer(list(records))
    follower = WeightsFollower("policy", consumer=consumer)
    assert await asyncio.to_thread(follower.wait_caught_up, 30.0)
    follower.close()
    assert follower.current() == 4 and consumer.closed and follower.caught_up.is_set()
    assert consumer.committed == records  # every version read is committed: the group's lag is visible


async def test_weights_follower_refuses_a_version_with_another_content_hash() -> None:
    from stacx.rollout.adapters import WeightsFollower
    from stacx.schemas.records import WeightVersion

    records = [
        WeightVersion(model_name="policy", version=3, path="/a/3", content_hash="sha256:a"),
        WeightVersion(model_name="policy", version=3, path="/b/3", content_hash="sha256:b"),
    ]
    follower = WeightsFollower("policy", consumer=_WeightsConsumer(list(records)))
    assert await asyncio.to_thread(follower.wait_caught_up, 30.0)
    follower.close()
    assert follower.current() == 3 and follower.num_conflicts == 1


@pytest.mark.parametrize("returned, problem", [
    ({"reward": 1.0, "note": "good"}, "component 'note' is a str, not a number"),
    ({"reward": None}, "component 'reward' is a NoneType, not a number"),
    (0.5, "returned a float, not a mapping of component names to numbers"),
    ({"reward": float("nan")}, "component 'reward' is nan; rewards are finite numbers"),
    ({"reward": 1.0, "bonus": float("-inf")}, "component 'bonus' is -inf; rewards are finite numbers"),
    ({"score": 1.0}, "returned no 'reward' component (got ['score']); return {'reward': <number>, ...}"),
    ({"reward": True}, "component 'reward' is a bool, not a number"),
])
async def test_a_reward_function_returning_no_numbers_fails_its_episode_in_one_line(
        returned: object, problem: str) -> None:
    """A user's reward that returns a non-number fails the episode with the reason (its event
    stays encodable and says why), instead of an event Avro cannot carry."""
    from stacx.schemas.codec import decode, encode
    from stacx.schemas.records import Trajectory

    inference = ScriptedInference(FakeTokenizer(), _script("<answer>42</answer>"))
    evaluator = _evaluator(inference, reward="exact_answer")
    evaluator.reward_fn = lambda answer, data: returned  # type: ignore[assignment,misc,return-value]
    traj = await _run(evaluator)
    assert traj.status is TrajectoryStatus.FAILED and traj.rewards == {"reward": 0.0}
    assert traj.error == f"RewardError: reward 'exact_answer' {problem}"
    assert decode(encode(traj), Trajectory).error == traj.error


async def test_a_reward_function_that_raises_fails_its_episode_in_one_line() -> None:
    def broken(answer: str | None, data: object) -> dict[str, float]:
        raise KeyError("answer")

    inference = ScriptedInference(FakeTokenizer(), _script("<answer>42</answer>"))
    evaluator = _evaluator(inference, reward="exact_answer")
    evaluator.reward_fn = broken
    traj = await _run(evaluator)
    assert traj.status is TrajectoryStatus.FAILED
    assert traj.error == "RewardError: reward 'exact_answer' raised KeyError: 'answer'"


async def test_each_tool_turn_records_its_sandbox_exit_code() -> None:
    tok = FakeTokenizer()
    inference = ScriptedInference(
        tok,
        _script(
            "<tool_call>print(6*)</tool_call>",  # a syntax error: exit code 1
            "<tool_call>print(6*7)</tool_call>",
            "The tool says <answer>42</answer>",
        ),
    )
    traj = await _run(_evaluator(inference, max_turns=3))

    assert [t.role for t in traj.turns] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert traj.metadata["exit_codes"] == "1,0"  # one per tool turn, in turn order
