"""ResourcePool: all-or-nothing grants, release on every exit, deadlock check, property tests."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stacx.rollout.errors import ResourceDeadlockError
from stacx.rollout.resources import (
    EvaluatorDemand,
    LocalPool,
    ResourcePool,
    Resources,
    check_feasible,
)


def test_check_feasible_names_resource_and_numbers() -> None:
    demand = EvaluatorDemand(
        name="swe", episode=Resources(sandboxes=1, memory_mb=8192), step=Resources(cpu=2)
    )
    with pytest.raises(ResourceDeadlockError) as info:
        check_feasible(Resources(sandboxes=4, cpu=8, memory_mb=4096, generations=1), [demand])
    message = str(info.value)
    assert "'swe'" in message and "memory_mb" in message and "8192" in message and "4096" in message


def test_check_feasible_accepts_budget_that_fits() -> None:
    demand = EvaluatorDemand(name="math", episode=Resources(sandboxes=1), step=Resources(cpu=1))
    check_feasible(Resources(sandboxes=1, cpu=1, generations=1), [demand])


async def test_acquire_is_all_or_nothing() -> None:
    pool = ResourcePool(Resources(sandboxes=2, cpu=1))
    await pool.acquire(Resources(cpu=1))
    waiter = asyncio.create_task(pool.acquire(Resources(sandboxes=1, cpu=1)))
    await asyncio.sleep(0)
    assert not waiter.done()
    assert pool.in_use == Resources(cpu=1), "a partial grant took sandboxes while cpu was short"
    # a smaller request of another kind is not blocked by the waiting one
    await asyncio.wait_for(pool.acquire(Resources(sandboxes=1)), 1)
    pool.release(Resources(cpu=1))
    await asyncio.wait_for(waiter, 1)
    assert pool.in_use == Resources(sandboxes=2, cpu=1)


async def test_request_larger_than_capacity_is_refused_at_once() -> None:
    pool = ResourcePool(Resources(gpus=1))
    with pytest.raises(ResourceDeadlockError, match="gpus"):
        await pool.acquire(Resources(gpus=2))


async def test_lease_releases_on_error_and_cancellation() -> None:
    pool = ResourcePool(Resources(sandboxes=1))
    with pytest.raises(RuntimeError):
        async with pool.lease(Resources(sandboxes=1)):
            raise RuntimeError("step failed")
    assert pool.in_use == Resources()

    entered = asyncio.Event()

    async def hold() -> None:
        async with pool.lease(Resources(sandboxes=1)):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(hold())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.in_use == Resources()


async def test_cancelled_waiter_leaves_no_trace() -> None:
    pool = ResourcePool(Resources(sandboxes=1))
    await pool.acquire(Resources(sandboxes=1))
    waiter = asyncio.create_task(pool.acquire(Resources(sandboxes=1)))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    pool.release(Resources(sandboxes=1))
    assert pool.in_use == Resources() and pool.try_acquire(Resources(sandboxes=1))


async def test_local_pool_draws_from_and_returns_to_global() -> None:
    pool = ResourcePool(Resources(sandboxes=3, cpu=4))
    async with LocalPool.drawn(pool, Resources(sandboxes=1, cpu=2), name="ep") as local:
        assert pool.in_use == Resources(sandboxes=1, cpu=2)
        async with local.lease(Resources(cpu=2)):
            assert local.in_use == Resources(cpu=2)
    assert pool.in_use == Resources()


# -- property tests ------------------------------------------------------------------------------

kinds = st.fixed_dictionaries(
    {
        "sandboxes": st.integers(0, 2),
        "cpu": st.sampled_from([0.0, 0.5, 1.0, 2.0]),
        "memory_mb": st.sampled_from([0, 256, 1024]),
        "gpus": st.integers(0, 1),
    }
)
demands = st.builds(
    lambda name, episode, step, gen: EvaluatorDemand(
        name=name, episode=Resources(**episode), step=Resources(**step), generate=Resources(generations=gen)
    ),
    st.sampled_from(["a", "b", "c"]),
    kinds,
    kinds,
    st.integers(0, 2),
)
episodes = st.lists(
    st.tuples(
        demands,
        st.lists(st.sampled_from(["generate", "step"]), max_size=5),
        st.sampled_from(["ok", "error", "cancel"]),
    ),
    min_size=1,
    max_size=25,
)
budgets = st.builds(
    Resources,
    sandboxes=st.integers(0, 6),
    cpu=st.sampled_from([0.0, 1.0, 2.5, 6.0]),
    memory_mb=st.sampled_from([0, 512, 4096]),
    generations=st.integers(0, 4),
    gpus=st.integers(0, 2),
)


class _Over(Exception):
    pass


async def _episode(pool: ResourcePool, demand: EvaluatorDemand, steps: list[str], end: str) -> None:
    async with LocalPool.drawn(pool, demand.local_pool, name=demand.name) as local:
        for step in steps:
            target, amount = (pool, demand.generate) if step == "generate" else (local, demand.step)
            async with target.lease(amount):
                if not pool.in_use.fits_in(pool.capacity):
                    raise _Over(f"{pool.in_use} exceeds {pool.capacity}")
                await asyncio.sleep(0)
        if end == "error":
            raise RuntimeError("episode failed")
        if end == "cancel":
            raise asyncio.CancelledError


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=budgets, workload=episodes)
def test_random_workloads_never_deadlock_nor_exceed_budget(budget: Resources, workload) -> None:
    try:
        check_feasible(budget, [d for d, _, _ in workload])
    except ResourceDeadlockError:
        return  # refused up front: exactly the configurations that could hang

    async def main() -> list[BaseException | None]:
        pool = ResourcePool(budget)
        tasks = [asyncio.create_task(_episode(pool, d, s, e)) for d, s, e in workload]
        # no timing: everything only yields, so a finished run needs finitely many loop turns;
        # the timeout only turns a deadlock into a failure instead of a hang.
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        assert pool.in_use == Resources(), f"leaked {pool.in_use}"
        assert pool.peak.fits_in(budget)
        return results

    results = asyncio.run(main())
    assert not any(isinstance(r, _Over) for r in results)
    assert all(r is None or isinstance(r, RuntimeError | asyncio.CancelledError) for r in results)


def _ring() -> list[EvaluatorDemand]:
    """a's model calls need cpu that b's episodes hold, b's need memory that c's hold, c's need
    the gpu a's hold: one cycle through three evaluators; d waits on b but nobody waits on d."""
    return [
        EvaluatorDemand(
            name="a", episode=Resources(sandboxes=1, gpus=1), generate=Resources(generations=1, cpu=1)
        ),
        EvaluatorDemand(
            name="b", episode=Resources(sandboxes=1, cpu=2), generate=Resources(generations=1, memory_mb=256)
        ),
        EvaluatorDemand(
            name="c",
            episode=Resources(sandboxes=1),
            step=Resources(memory_mb=512),
            generate=Resources(generations=1, gpus=1),
        ),
        EvaluatorDemand(name="d", episode=Resources(sandboxes=1), generate=Resources(generations=1, cpu=2)),
    ]


def test_a_cycle_through_three_evaluators_is_found_and_broken_by_a_reserve() -> None:
    budget = Resources(sandboxes=4, cpu=3, memory_mb=1024, gpus=2, generations=2)
    feasibility = check_feasible(budget, _ring())
    # d's 2 cpu are not on a cycle: only a's 1 cpu is reserved
    assert feasibility.reserve == Resources(cpu=1, memory_mb=256, gpus=1)
    assert feasibility.cycles == (
        "cycle [b -> c -> a -> b]: episodes of 'b' hold cpu while model calls of 'a' wait for 1 cpu",
        "cycle [c -> a -> b -> c]: episodes of 'c' hold memory_mb while model calls of 'b' wait for "
        "256 memory_mb",
        "cycle [a -> b -> c -> a]: episodes of 'a' hold gpus while model calls of 'c' wait for 1 gpus",
    )


def test_a_cycle_the_budget_cannot_break_names_the_holder_and_the_pool_to_raise() -> None:
    budget = Resources(sandboxes=4, cpu=2.5, memory_mb=1024, gpus=2, generations=2)
    with pytest.raises(ResourceDeadlockError) as error:
        check_feasible(budget, _ring())
    assert str(error.value) == (
        "this resource configuration can wait forever: cycle [b -> c -> a -> b]: episodes of 'b' hold "
        "cpu while model calls of 'a' wait for 1 cpu; breaking it needs 1 cpu kept free for model calls "
        "beside one episode of 'b' holding 2 (episode + step), but the budget has 2.5 cpu: raise pool.cpu "
        "to 3, or take cpu out of `generate` or out of `episode`/`step`. Raise `pool` in the config or "
        "lower the evaluators' demands."
    )


def test_oversized_parts_and_cycles_are_all_named_in_one_message() -> None:
    demands = [
        EvaluatorDemand(
            name="a", episode=Resources(sandboxes=1, cpu=1), generate=Resources(generations=1, cpu=5)
        ),
        EvaluatorDemand(name="b", episode=Resources(sandboxes=1), generate=Resources(generations=1)),
        EvaluatorDemand(name="c", episode=Resources(sandboxes=1, cpu=5), generate=Resources(generations=1)),
    ]
    with pytest.raises(ResourceDeadlockError) as error:
        check_feasible(Resources(sandboxes=4, cpu=4, generations=2), demands)
    cycle = "cycle [a]: episodes of 'a' hold cpu while model calls of 'a' wait for 5 cpu"
    tail = "or take cpu out of `generate` or out of `episode`/`step`"
    # b holds no cpu: it is not named
    assert str(error.value) == (
        "this resource configuration can wait forever: "
        "evaluator 'a' needs 5 cpu at once (generate) but the global budget has 4; "
        "evaluator 'c' needs 5 cpu at once (episode + step) but the global budget has 4; "
        f"{cycle}; breaking it needs 5 cpu kept free for model calls beside one episode of 'a' holding 1 "
        f"(episode + step), but the budget has 4 cpu: raise pool.cpu to 6, {tail}; "
        f"{cycle}; breaking it needs 5 cpu kept free for model calls beside one episode of 'c' holding 5 "
        f"(episode + step), but the budget has 4 cpu: raise pool.cpu to 10, {tail}. "
        "Raise `pool` in the config or lower the evaluators' demands."
    )


def test_the_reserve_is_the_largest_model_call_on_a_cycle_and_may_be_fractional() -> None:
    demands = [
        EvaluatorDemand(name="x", episode=Resources(cpu=1), generate=Resources(generations=1, cpu=0.5)),
        EvaluatorDemand(name="y", episode=Resources(cpu=1), generate=Resources(generations=1, cpu=0.25)),
    ]
    # one episode (1 cpu) beside the reserve (0.5) fits the budget exactly
    assert check_feasible(Resources(cpu=1.5, generations=2), demands).reserve == Resources(cpu=0.5)


def test_a_cycle_that_does_not_lead_back_is_searched_to_its_end() -> None:
    """a waits on b, b on c, and c and d wait on each other: no path from b back to a."""
    demands = [
        EvaluatorDemand(name="a", episode=Resources(sandboxes=1), generate=Resources(generations=1, cpu=1)),
        EvaluatorDemand(name="b", episode=Resources(cpu=1), generate=Resources(generations=1, memory_mb=1)),
        EvaluatorDemand(name="c", episode=Resources(memory_mb=1), generate=Resources(generations=1, gpus=1)),
        EvaluatorDemand(name="d", episode=Resources(gpus=1), generate=Resources(generations=1, memory_mb=1)),
    ]
    feasibility = check_feasible(Resources(sandboxes=2, cpu=2, memory_mb=4, gpus=2, generations=2), demands)
    assert feasibility.reserve == Resources(memory_mb=1, gpus=1)
    assert [c.split(":")[0] for c in feasibility.cycles] == ["cycle [d -> c -> d]", "cycle [c -> d -> c]"]
