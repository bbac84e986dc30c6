"""`freeze_startup_heap`: what a service made at start-up leaves the collector's reach."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from stacx.infra.heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()  # a service started in-process by an earlier test may have frozen its heap
    yield
    gc.unfreeze()  # the rest of the test session keeps its normal collector


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


@pytest.mark.usefixtures("unfrozen")
def test_start_up_objects_are_frozen_and_later_ones_are_not() -> None:
    model = {"weights": [1.0, 2.0]}  # a start-up object
    assert _tracked(model)

    frozen = freeze_startup_heap("test")

    # threads left by earlier tests may free frozen objects meanwhile: the count can only fall
    assert frozen > 0 and 0 < gc.get_freeze_count() <= frozen
    assert not _tracked(model)  # full collections no longer walk it
    request = {"body": [1]}  # made while serving: collected as usual
    assert _tracked(request)


@pytest.mark.usefixtures("unfrozen")
def test_garbage_made_before_the_call_is_collected_not_frozen() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    marker = id(cycle)
    del cycle

    freeze_startup_heap("test")
    gc.unfreeze()

    assert not any(id(o) == marker and isinstance(o, list) and o and o[0] is o for o in gc.get_objects())
