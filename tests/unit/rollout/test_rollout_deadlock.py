"""The whole-config feasibility check: hold-and-wait cycles through `generate` are broken by a
reserve or refused with the cycle named; random configurations either are refused or finish."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stacx.rollout.data import ListTaskSource
from stacx.rollout.errors import ResourceDeadlockError
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, MemoryPublisher, ScriptedInference
from stacx.rollout.manager import RolloutManager
from stacx.rollout.resources import EvaluatorDemand, LocalPool, ResourcePool, Resources, check_feasible
from stacx.schemas.records import TaskSample

TOOL_THEN_ANSWER = ("<tool_call>print(6*7)</tool_call>", "<answer>42</answer>")


def _policy(context: str, call: int) -> str:
    return TOOL_THEN_ANSWER[1] if "<tool_response>\n" in context else TOOL_THEN_ANSWER[0]


def _tasks(num: int, task_type: str) -> list[TaskSample]:
    return [
        TaskSample(task_id=f"{task_type}-{i}", task_type=task_type, prompt=f"q{i}", data='{"answer": 42}')
        for i in range(num)
    ]


def _manager(tasks: list[TaskSample], **config) -> RolloutManager:  # type: ignore[no-untyped-def]
    tok = FakeTokenizer()
    return RolloutManager(
        RolloutManager.Config(**config),
        source=ListTaskSource(tasks),
        tokenizer=tok,
        inference=ScriptedInference(tok, _policy),
        publisher=MemoryPublisher(),
        sandbox=FakeEnvironments(),
    )


# The three configurations of the audit: each passed the old per-evaluator check, then hung with
# every episode holding its share while waiting for a model call that needed the same kind.
AUDITED = {
    "generations in episode and generate": (
        {"episode": {"sandboxes": 1, "generations": 1}, "step": {}, "generate": {"generations": 1}},
        {"sandboxes": 8, "generations": 2},
    ),
    "cpu in step and generate": (
        {"episode": {"sandboxes": 1}, "step": {"cpu": 1}, "generate": {"generations": 1, "cpu": 1}},
        {"sandboxes": 8, "cpu": 2, "generations": 8},
    ),
    "gpus in episode and generate": (
        {"episode": {"sandboxes": 1, "gpus": 1}, "step": {}, "generate": {"generations": 1, "gpus": 1}},
        {"sandboxes": 8, "gpus": 2, "generations": 8},
    ),
}


@pytest.mark.parametrize("name", sorted(AUDITED))
async def test_audited_configs_that_hung_now_finish(name: str) -> None:
    demand, pool = AUDITED[name]
    manager = _manager(_tasks(8, "math"), pool=pool, evaluators={"default": Evaluator.Config(**demand)})
    summary = await asyncio.wait_for(manager.run(), 20)  # the old engine hung here forever
    assert summary.by_status == {"COMPLETED": 8}
    assert manager.pool.in_use == Resources()
    assert not manager.pool.reserve.is_zero()  # the cycle was found and broken


def test_unbreakable_cross_evaluator_cycle_is_refused_and_named() -> None:
    # a's episodes hold the gpu and wait for cpu; b's hold the cpu and wait for the gpu
    a = EvaluatorDemand(name="a", episode=Resources(gpus=1), generate=Resources(cpu=1))
    b = EvaluatorDemand(name="b", episode=Resources(), step=Resources(cpu=1), generate=Resources(gpus=1))
    with pytest.raises(ResourceDeadlockError) as info:
        check_feasible(Resources(gpus=1, cpu=1), [a, b])
    message = str(info.value)
    assert "cycle [a -> b -> a]" in message or "cycle [b -> a -> b]" in message
    assert "pool.gpus to 2" in message and "pool.cpu to 2" in message


def test_cross_evaluator_cycle_gets_a_reserve_when_the_budget_allows() -> None:
    a = EvaluatorDemand(name="a", episode=Resources(gpus=1), generate=Resources(cpu=1))
    b = EvaluatorDemand(name="b", episode=Resources(), step=Resources(cpu=1), generate=Resources(gpus=1))
    verdict = check_feasible(Resources(gpus=4, cpu=4), [a, b])
    assert verdict.reserve == Resources(gpus=1, cpu=1)
    assert len(verdict.cycles) == 2


def test_waiting_without_a_cycle_needs_no_reserve() -> None:
    # b's model calls wait for gpus that a's episodes hold, but a never waits for anything b holds
    a = EvaluatorDemand(name="a", episode=Resources(gpus=1), generate=Resources(generations=1))
    b = EvaluatorDemand(name="b", episode=Resources(sandboxes=1), generate=Resources(gpus=1))
    verdict = check_feasible(Resources(gpus=1, sandboxes=1, generations=1), [a, b])
    assert verdict.reserve == Resources() and verdict.cycles == ()


def test_self_cycle_without_room_for_the_reserve_is_refused() -> None:
    demand = EvaluatorDemand(name="gpu", episode=Resources(gpus=1), generate=Resources(gpus=1))
    with pytest.raises(ResourceDeadlockError, match=r"cycle \[gpu\].*pool.gpus to 2"):
        check_feasible(Resources(gpus=1), [demand])


async def test_hold_grants_leave_the_reserve_to_model_calls() -> None:
    pool = ResourcePool(Resources(gpus=2), reserve=Resources(gpus=1))
    assert pool.try_acquire(Resources(gpus=1), hold=True)
    assert not pool.try_acquire(Resources(gpus=1), hold=True)  # the second gpu is kept free
    assert pool.try_acquire(Resources(gpus=1))  # ... for a model call
    with pytest.raises(ResourceDeadlockError, match="kept for model calls"):
        await pool.acquire(Resources(gpus=2), hold=True)


# -- property tests: mixed configurations are refused, or every episode finishes ----------------

amounts = st.fixed_dictionaries(
    {
        "sandboxes": st.sampled_from([0, 0, 1]),
        "cpu": st.sampled_from([0.0, 0.0, 0.0, 1.0, 2.0]),
        "generations": st.sampled_from([0, 0, 1]),
        "gpus": st.sampled_from([0, 0, 0, 1]),
    }
)
demands = st.builds(
    lambda name, episode, step, generate: EvaluatorDemand(
        name=name, episode=Resources(**episode), step=Resources(**step), generate=Resources(**generate)
    ),
    st.sampled_from(["a", "b", "c"]),
    amounts,
    amounts,
    amounts,
)
budgets = st.builds(
    Resources,
    sandboxes=st.integers(1, 5),
    cpu=st.sampled_from([1.0, 2.0, 3.0, 5.0]),
    generations=st.integers(1, 3),
    gpus=st.integers(1, 3),
)


async def _episode(pool: ResourcePool, demand: EvaluatorDemand, turns: int) -> None:
    async with LocalPool.drawn(pool, demand.local_pool, name=demand.name) as local:
        for _ in range(turns):
            async with pool.lease(demand.generate):
                await asyncio.sleep(0)
            async with local.lease(demand.step):
                await asyncio.sleep(0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    budget=budgets,
    kinds=st.lists(demands, min_size=1, max_size=3, unique_by=lambda d: d.name),
    num_episodes=st.integers(1, 12),
    turns=st.integers(1, 3),
)
def test_mixed_configs_are_refused_or_make_progress(
    budget: Resources, kinds: list[EvaluatorDemand], num_episodes: int, turns: int
) -> None:
    try:
        verdict = check_feasible(budget, kinds)
    except ResourceDeadlockError:
        event("refused")
        return
    event("accepted with a reserve" if not verdict.reserve.is_zero() else "accepted")

    async def main() -> None:
        pool = ResourcePool(budget, reserve=verdict.reserve)
        work = [kinds[i % len(kinds)] for i in range(num_episodes)]
        # every coroutine only yields, so a run that can finish needs finitely many loop turns;
        # the bound turns a deadlock into a failure instead of a hang
        await asyncio.wait_for(asyncio.gather(*(_episode(pool, d, turns) for d in work)), 20)
        assert pool.in_use == Resources() and pool.peak.fits_in(budget)

    asyncio.run(main())


evaluator_configs = st.builds(
    lambda episode, step, generate: Evaluator.Config(
        episode={"sandboxes": 1, **{k: v for k, v in episode.items() if v}},
        step={k: v for k, v in step.items() if v},
        generate={k: v for k, v in generate.items() if v},
    ),
    amounts,
    amounts,
    amounts,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    math=evaluator_configs,
    shell=evaluator_configs,
    pool=st.fixed_dictionaries(
        {
            "sandboxes": st.integers(1, 4),
            "cpu": st.sampled_from([2.0, 3.0, 4.0]),
            "generations": st.integers(1, 3),
            "gpus": st.integers(1, 3),
        }
    ),
    concurrency=st.integers(1, 8),
)
def test_whole_manager_configs_are_refused_or_finish(
    math: Evaluator.Config, shell: Evaluator.Config, pool: dict[str, float], concurrency: int
) -> None:
    tasks = _tasks(4, "math") + _tasks(4, "shell")
    try:
        manager = _manager(
            tasks,
            pool=pool,
            max_concurrent_episodes=concurrency,
            evaluators={"math": math, "shell": shell},
        )
    except ResourceDeadlockError:
        event("refused")
        return
    event("accepted with a reserve" if not manager.pool.reserve.is_zero() else "accepted")
    summary = asyncio.run(asyncio.wait_for(manager.run(), 20))
    assert summary.by_status == {"COMPLETED": 8}
    assert manager.pool.in_use == Resources()
