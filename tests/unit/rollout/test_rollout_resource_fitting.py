"""Resource fitting counts every kind: memory, sandboxes, cpu, generations and gpus."""

from __future__ import annotations

import asyncio

import pytest

from stacx.rollout.errors import ConfigError, ResourceDeadlockError
from stacx.rollout.resources import LocalPool, ResourcePool, Resources

CAPACITY = Resources(sandboxes=2, cpu=2.0, memory_mb=1024, generations=2, gpus=1)


@pytest.mark.parametrize("kind", ["sandboxes", "cpu", "memory_mb", "generations", "gpus"])
def test_a_demand_over_capacity_in_one_kind_does_not_fit(kind: str) -> None:
    over = Resources(**{kind: CAPACITY.as_dict()[kind] + 1})  # type: ignore[arg-type]
    assert not over.fits_in(CAPACITY)
    assert over.shortfalls(CAPACITY) == [(kind, CAPACITY.as_dict()[kind] + 1, CAPACITY.as_dict()[kind])]
    assert Resources(**{kind: CAPACITY.as_dict()[kind]}).fits_in(CAPACITY)  # type: ignore[arg-type]


def test_memory_decides_whether_a_hold_is_granted() -> None:
    pool = ResourcePool(CAPACITY)
    assert pool.try_acquire(Resources(sandboxes=1, memory_mb=600), hold=True)
    assert not pool.fits(Resources(sandboxes=1, memory_mb=600))
    assert not pool.try_acquire(Resources(sandboxes=1, memory_mb=600), hold=True)
    assert pool.in_use == Resources(sandboxes=1, memory_mb=600)
    assert pool.try_acquire(Resources(sandboxes=1, memory_mb=424), hold=True)
    with pytest.raises(ResourceDeadlockError, match="memory_mb"):
        pool.try_acquire(Resources(memory_mb=2048))


def test_arithmetic_and_mapping_cover_every_kind() -> None:
    a = Resources(sandboxes=1, cpu=0.5, memory_mb=100, generations=1, gpus=1)
    assert (a + a).as_dict() == {"sandboxes": 2, "cpu": 1.0, "memory_mb": 200, "generations": 2, "gpus": 2}
    assert (CAPACITY - a).as_dict() == {
        "sandboxes": 1,
        "cpu": 1.5,
        "memory_mb": 924,
        "generations": 1,
        "gpus": 0,
    }
    assert a.join(Resources(memory_mb=500, cpu=0.1)) == Resources(
        sandboxes=1, cpu=0.5, memory_mb=500, generations=1, gpus=1
    )
    for kind in Resources.kinds():
        assert not Resources(**{kind: 1}).is_zero()  # type: ignore[arg-type]
    assert Resources().is_zero()
    assert Resources(cpu=1.0 + 1e-12).fits_in(Resources(cpu=1.0))  # float slack for cpu only
    assert Resources.from_mapping({"memory_mb": 64}, where="pool") == Resources(memory_mb=64)
    with pytest.raises(ConfigError, match=r"pool: unknown resource kind\(s\) \['ram'\]"):
        Resources.from_mapping({"ram": 1}, where="pool")
    with pytest.raises(ConfigError, match=r"pool.memory_mb = -1 is negative"):
        Resources.from_mapping({"memory_mb": -1}, where="pool")


def test_holds_leave_the_reserve_free_and_transient_grants_may_use_it() -> None:
    pool = ResourcePool(Resources(cpu=4), name="p", reserve=Resources(cpu=1))
    assert pool.fits(Resources(cpu=4))  # a transient grant (the default) may use the reserve
    assert not pool.fits(Resources(cpu=4), hold=True)
    assert pool.try_acquire(Resources(cpu=3), hold=True)
    assert pool.held == Resources(cpu=3) and pool.in_use == Resources(cpu=3)
    assert not pool.fits(Resources(cpu=1), hold=True)  # 3 held + 1 + 1 kept > 4
    assert not pool.try_acquire(Resources(cpu=1), hold=True)
    assert pool.try_acquire(Resources(cpu=1))  # a model call takes the reserve
    assert pool.peak == Resources(cpu=4) and pool.num_grants == 2
    pool.release(Resources(cpu=1))  # transient: the hold stays
    assert pool.held == Resources(cpu=3) and pool.in_use == Resources(cpu=3)
    pool.release(Resources(cpu=3), hold=True)
    assert pool.held == Resources() and pool.in_use == Resources() and pool.peak == Resources(cpu=4)
    assert ResourcePool(Resources(cpu=4), reserve=Resources(cpu=1)).try_acquire(Resources(cpu=4))


def test_requests_that_can_never_be_granted_name_the_pool_and_what_is_kept() -> None:
    pool = ResourcePool(Resources(cpu=4), name="p", reserve=Resources(cpu=1))
    with pytest.raises(ResourceDeadlockError) as held:
        pool.try_acquire(Resources(cpu=4), hold=True)
    assert str(held.value) == (
        "pool 'p': a request for 4 cpu can never be granted (capacity 4, 1 kept for model calls)"
    )
    with pytest.raises(ResourceDeadlockError) as transient:
        ResourcePool(Resources(cpu=4)).try_acquire(Resources(cpu=5))
    assert str(transient.value) == "pool 'global': a request for 5 cpu can never be granted (capacity 4)"


def test_listeners_hear_every_release() -> None:
    pool = ResourcePool(Resources(cpu=2))
    heard: list[int] = []
    pool.subscribe(lambda: heard.append(len(heard)))
    pool.try_acquire(Resources(cpu=1))
    pool.release(Resources(cpu=1))
    pool.try_acquire(Resources(cpu=1))
    pool.release(Resources(cpu=1))
    assert heard == [0, 1]


async def test_a_waiting_hold_is_not_granted_from_the_reserve() -> None:
    pool = ResourcePool(Resources(cpu=4), name="p", reserve=Resources(cpu=1))
    assert pool.try_acquire(Resources(cpu=3), hold=True)
    waiter = asyncio.create_task(pool.acquire(Resources(cpu=1), hold=True))
    await asyncio.sleep(0)
    assert not waiter.done()
    await pool.acquire(Resources(cpu=1))  # transient: granted at once from the reserve
    pool.release(Resources(cpu=1))  # wakes the waiter, which still does not fit as a hold
    await asyncio.sleep(0)
    assert not waiter.done() and pool.in_use == Resources(cpu=3)
    pool.release(Resources(cpu=3), hold=True)
    await asyncio.wait_for(waiter, 5)
    assert pool.held == Resources(cpu=1) and pool.in_use == Resources(cpu=1)


async def test_a_hold_granted_while_its_waiter_is_cancelled_is_given_back() -> None:
    pool = ResourcePool(Resources(cpu=4), name="p", reserve=Resources(cpu=1))
    assert pool.try_acquire(Resources(cpu=3), hold=True)
    waiter = asyncio.create_task(pool.acquire(Resources(cpu=2), hold=True))
    await asyncio.sleep(0)
    pool.release(Resources(cpu=3), hold=True)  # grants the waiter ...
    assert pool.held == Resources(cpu=2)
    waiter.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.held == Resources() and pool.in_use == Resources()


async def test_a_local_pool_is_a_hold_on_its_parent_returned_once() -> None:
    parent = ResourcePool(Resources(cpu=4), reserve=Resources(cpu=1))
    local = LocalPool(parent, Resources(cpu=2), name="ev")
    assert local.close() is False and parent.in_use == Resources()  # never opened: nothing to return
    assert local.try_open() is True and parent.held == Resources(cpu=2)
    assert LocalPool(parent, Resources(cpu=2), name="ev2").try_open() is False  # would eat the reserve
    with pytest.raises(ResourceDeadlockError, match="^pool 'ev': a request for 3 cpu"):
        local.try_acquire(Resources(cpu=3))
    assert local.close() is True and parent.held == Resources() and parent.in_use == Resources()
    assert local.close() is False and parent.in_use == Resources()
    await local.open()
    assert parent.held == Resources(cpu=2) and local.close() is True and parent.held == Resources()
