"""A task with its own agent timeout (Harbor's `[agent] timeout_sec`) runs as Harbor runs a trial:
the agent gets the task's time, not the evaluator's; the tests run after an agent timeout and their
reward counts; the sandbox lives long enough for both."""

from __future__ import annotations

import json

from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, ScriptedInference
from stacx.rollout.protocols import TaskGroup
from stacx.rollout.resources import LocalPool, ResourcePool, Resources
from stacx.schemas.records import TaskSample, TrajectoryStatus

BUDGET = Resources(sandboxes=4, cpu=4, memory_mb=4096, generations=2)


def _harbor_group(agent_s: float, verifier_s: float = 30.0) -> TaskGroup:
    data = json.dumps({"agent_timeout_s": agent_s, "verifier_timeout_s": verifier_s, "cpus": 1})
    task = TaskSample(task_id="harbor-task", task_type="harbor", prompt="fix it", data=data)
    return TaskGroup(group_id="g1", task=task, num_samples=1)


async def _run(inference: ScriptedInference, envs: FakeEnvironments, group: TaskGroup, **options: object):
    config = Evaluator.Config(scaffold="retool", reward="verifier", verifier="harbor", **options)  # type: ignore[arg-type]
    evaluator = Evaluator(config, name="harbor", tokenizer=inference.tokenizer, inference=inference,
                          environments=envs, global_pool=ResourcePool(BUDGET))
    async with LocalPool.drawn(evaluator.global_pool, evaluator.demand.local_pool, name="ep") as lp:
        return await evaluator.run(group, 0, lp)


def _agent(*texts: str) -> ScriptedInference:
    return ScriptedInference(FakeTokenizer(), lambda context, call: texts[min(call, len(texts) - 1)])


async def test_the_tests_run_after_an_agent_timeout_and_their_reward_counts() -> None:
    envs = FakeEnvironments(delay_s=3600)  # the agent's command never returns
    traj = await _run(_agent("<tool_call>print(1)</tool_call>"), envs, _harbor_group(agent_s=0.05),
                      episode_timeout_s=2.0)
    assert traj.status is TrajectoryStatus.TIMED_OUT
    assert "[agent] timeout_sec = 0.05 s; its tests ran" in (traj.error or "")
    assert traj.reward == 1.0 and traj.rewards == {"reward": 1.0}  # the verifier's, not 0
    assert envs.open_sessions == []


async def test_the_tasks_own_agent_timeout_governs_not_the_evaluators() -> None:
    slow = ScriptedInference(FakeTokenizer(), lambda context, call: "<answer>done</answer>", delay_s=0.2)
    envs = FakeEnvironments()
    traj = await _run(slow, envs, _harbor_group(agent_s=30.0, verifier_s=900.0), episode_timeout_s=0.05)
    assert traj.status is TrajectoryStatus.COMPLETED and traj.reward == 1.0
    assert envs.lifetimes == [30.0 + 900.0 + 120.0]  # agent, then tests, then slack


async def test_a_task_without_its_own_timeout_keeps_the_episode_timeout() -> None:
    envs = FakeEnvironments(delay_s=3600)
    task = TaskSample(task_id="t", task_type="math", prompt="p", data='{"answer": 1}')
    traj = await _run(_agent("<tool_call>print(1)</tool_call>"), envs,
                      TaskGroup(group_id="g", task=task, num_samples=1), episode_timeout_s=0.05)
    assert traj.status is TrajectoryStatus.TIMED_OUT and "episode_timeout_s" in (traj.error or "")
    assert traj.reward == 0.0
