"""The rebalance watchdog: how long a worker has been unsettled, against its timeout."""

from __future__ import annotations

import pytest

from stacx.consumers.assembly import AssemblerApp
from stacx.consumers.assembly.errors import AssemblyConfigError
from stacx.consumers.assembly.watchdog import RebalanceWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_is_overdue_once_unsettled_for_the_timeout_from_its_start() -> None:
    clock = Clock()
    dog = RebalanceWatchdog(60.0, clock=clock)
    clock.now += 59.9
    assert dog.overdue(settled=False) is None
    clock.now += 0.1
    assert dog.overdue(settled=False) == pytest.approx(60.0)


def test_settling_resets_the_wait_and_a_later_rebalance_starts_its_own() -> None:
    clock = Clock()
    dog = RebalanceWatchdog(60.0, clock=clock)
    clock.now += 50
    assert dog.overdue(settled=True) is None
    clock.now += 1000  # settled all along
    assert dog.overdue(settled=True) is None
    assert dog.overdue(settled=False) is None  # a rebalance begins now
    clock.now += 59
    assert dog.overdue(settled=False) is None
    clock.now += 2
    assert dog.overdue(settled=False) == pytest.approx(61.0)


def test_a_zero_timeout_never_gives_up_and_polls_are_at_most_five_seconds_apart() -> None:
    clock = Clock()
    dog = RebalanceWatchdog(0.0, clock=clock)
    clock.now += 1e6
    assert dog.overdue(settled=False) is None
    assert RebalanceWatchdog(300.0).poll_s == 5.0
    assert RebalanceWatchdog(2.0).poll_s == 0.5


def test_a_negative_rebalance_timeout_is_refused() -> None:
    with pytest.raises(AssemblyConfigError, match="rebalance_timeout_s must be >= 0, got -1"):
        AssemblerApp.Config(app_id="a", rebalance_timeout_s=-1)
