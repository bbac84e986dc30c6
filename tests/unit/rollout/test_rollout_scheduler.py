"""TaskScheduler strategies: each test pins the exact dispatch order."""

from __future__ import annotations

import pytest

from rollout.errors import ConfigError
from rollout.protocols import TaskGroup
from rollout.scheduler import TaskScheduler
from schemas.records import TaskSample


def _group(task_id: str, task_type: str, priority: int = 0, n: int = 1) -> TaskGroup:
    task = TaskSample(task_id=task_id, task_type=task_type, prompt="p", priority=priority)
    return TaskGroup(group_id=f"g-{task_id}", task=task, num_samples=n)


def _drain(scheduler: TaskScheduler) -> list[str]:
    order = []
    while (group := scheduler.pop()) is not None:
        order.append(group.task.task_id)
    return order


def _fill(scheduler: TaskScheduler, groups: list[TaskGroup]) -> TaskScheduler:
    for group in groups:
        scheduler.push(group)
    return scheduler


def test_fifo_is_arrival_order_across_types() -> None:
    groups = [_group("m1", "math"), _group("s1", "shell"), _group("m2", "math"), _group("s2", "shell")]
    scheduler = _fill(TaskScheduler(TaskScheduler.Config(strategy="fifo")), groups)
    assert scheduler.pending_by_type() == {"math": 2, "shell": 2}
    assert _drain(scheduler) == ["m1", "s1", "m2", "s2"]


def test_priority_highest_first_then_arrival() -> None:
    groups = [
        _group("a", "math", 0),
        _group("b", "shell", 5),
        _group("c", "math", 5),
        _group("d", "shell", 1),
    ]
    scheduler = _fill(TaskScheduler(TaskScheduler.Config(strategy="priority")), groups)
    assert _drain(scheduler) == ["b", "c", "d", "a"]


def test_fair_share_follows_weights() -> None:
    config = TaskScheduler.Config(strategy="fair_share", weights={"math": 2, "shell": 1})
    groups = [_group(f"m{i}", "math") for i in range(6)] + [_group(f"s{i}", "shell") for i in range(3)]
    order = _drain(_fill(TaskScheduler(config), groups))
    # virtual finish tags: math 0.5, 1.0, 1.5 ...; shell 1, 2, 3; ties go to earlier arrival
    assert order == ["m0", "m1", "s0", "m2", "m3", "s1", "m4", "m5", "s2"]


def test_fair_share_counts_samples_not_groups() -> None:
    config = TaskScheduler.Config(strategy="fair_share")
    groups = [_group("big", "swe", n=4), _group("b2", "swe", n=4)] + [
        _group(f"q{i}", "math") for i in range(5)
    ]
    order = _drain(_fill(TaskScheduler(config), groups))
    # tags: swe 4 then 8 (4 samples per group); math 1, 2, 3, 4, 5; the tie at 4 goes to the
    # earlier arrival (big)
    assert order == ["q0", "q1", "q2", "big", "q3", "q4", "b2"]


def test_task_aware_interleaves_toward_ratios_per_batch() -> None:
    config = TaskScheduler.Config(strategy="task_aware", ratios={"math": 3, "shell": 1}, batch_size=4)
    groups = [_group(f"m{i}", "math") for i in range(6)] + [_group(f"s{i}", "shell") for i in range(4)]
    order = _drain(_fill(TaskScheduler(config), groups))
    # deficit = ratio * position - taken; ties to the earlier arrival. Batch 1: m (.75 vs .25),
    # m (.5 tie, m arrived first), s (.75 vs .25), m. Each batch holds 3 math and 1 shell.
    assert order[:8] == ["m0", "m1", "s0", "m2", "m3", "m4", "s1", "m5"]
    assert order[8:] == ["s2", "s3"]  # math ran out: shell fills the rest (the surplus)


def test_unknown_strategy_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="fifo, priority, fair_share, task_aware"):
        TaskScheduler(TaskScheduler.Config(strategy="random"))


def test_task_aware_needs_ratios() -> None:
    with pytest.raises(ConfigError, match="ratios"):
        TaskScheduler(TaskScheduler.Config(strategy="task_aware"))
