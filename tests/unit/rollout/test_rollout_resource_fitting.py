"""Resource fitting counts every kind: memory, sandboxes, cpu, generations and gpus."""

from __future__ import annotations

import pytest

from rollout.errors import ConfigError, ResourceDeadlockError
from rollout.resources import ResourcePool, Resources

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
