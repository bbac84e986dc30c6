"""TaskScheduler strategies: each test pins the exact dispatch order."""

from __future__ import annotations

import pytest

from stacx.rollout.errors import ConfigError
from stacx.rollout.protocols import TaskGroup
from stacx.rollout.scheduler import TaskScheduler
from stacx.schemas.records import TaskSample


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
    with pytest.raises(ConfigError, match=r"\['fair_share', 'fifo', 'priority', 'task_aware'\]"):
        TaskScheduler(TaskScheduler.Config(strategy="random"))


def test_task_aware_needs_ratios() -> None:
    with pytest.raises(ConfigError, match="ratios"):
        TaskScheduler(TaskScheduler.Config(strategy="task_aware"))


# -- fair share and task-aware under skewed and bursty arrivals ---------------------------------


def _pop(scheduler: TaskScheduler, count: int) -> list[str]:
    order = []
    for _ in range(count):
        group = scheduler.pop()
        assert group is not None
        order.append(group.task.task_type)
    return order


def _feed(scheduler: TaskScheduler, task_type: str, count: int, n: int = 1) -> None:
    for i in range(count):
        scheduler.push(_group(f"{task_type}{scheduler._seq}-{i}", task_type, n=n))


def _longest_run(order: list[str], task_type: str) -> int:
    longest = current = 0
    for item in order:
        current = current + 1 if item == task_type else 0
        longest = max(longest, current)
    return longest


def test_fair_share_newcomer_gets_its_share_not_a_monopoly() -> None:
    scheduler = TaskScheduler(TaskScheduler.Config(strategy="fair_share"))
    _feed(scheduler, "a", 100)
    assert _pop(scheduler, 100) == ["a"] * 100
    for _ in range(100):  # b arrives while a is still busy
        _feed(scheduler, "a", 1)
        _feed(scheduler, "b", 1)
    order = _pop(scheduler, 100)
    # lifetime counts gave b the next 100 pops (a served 100 before b existed)
    assert order.count("b") == 50 and _longest_run(order, "b") == 1


def test_fair_share_skewed_backlog_follows_weights() -> None:
    config = TaskScheduler.Config(strategy="fair_share", weights={"a": 3, "b": 1})
    scheduler = TaskScheduler(config)
    _feed(scheduler, "a", 300)
    _feed(scheduler, "b", 100)
    order = _pop(scheduler, 80)
    assert order.count("a") == 60 and order.count("b") == 20


def test_fair_share_bursts_interleave_instead_of_taking_over() -> None:
    scheduler = TaskScheduler(TaskScheduler.Config(strategy="fair_share", lookahead=10_000))
    _feed(scheduler, "a", 1000)
    order: list[str] = []
    for _ in range(10):  # b comes in bursts of 5 after a long absence each time
        order += _pop(scheduler, 20)
        _feed(scheduler, "b", 5)
    order += _pop(scheduler, 20)
    assert order.count("b") == 50  # every burst is served within the next 20 pops ...
    assert _longest_run(order, "b") == 1  # ... at its share (1:1), never as a monopoly
    assert _longest_run(order[20:], "a") <= 11


def test_fair_share_counts_samples_under_skew() -> None:
    scheduler = TaskScheduler(TaskScheduler.Config(strategy="fair_share"))
    _feed(scheduler, "big", 50, n=4)
    _feed(scheduler, "small", 200, n=1)
    order = _pop(scheduler, 100)
    samples_big, samples_small = 4 * order.count("big"), order.count("small")
    assert abs(samples_big - samples_small) <= 4


def test_task_aware_holds_ratios_across_batches() -> None:
    config = TaskScheduler.Config(strategy="task_aware", ratios={"a": 0.7, "b": 0.3}, batch_size=4)
    scheduler = TaskScheduler(config)
    _feed(scheduler, "a", 200)
    _feed(scheduler, "b", 200)
    order = _pop(scheduler, 100)
    # per-batch counts rounded every batch of 4 to 3:1, i.e. 75/25
    assert order.count("a") == 70 and order.count("b") == 30


def test_task_aware_schedules_a_small_ratio_below_one_per_batch() -> None:
    config = TaskScheduler.Config(strategy="task_aware", ratios={"a": 0.95, "b": 0.05}, batch_size=8)
    scheduler = TaskScheduler(config)
    _feed(scheduler, "a", 300)
    _feed(scheduler, "b", 300)
    order = _pop(scheduler, 200)
    assert order.count("b") == 10  # 5%; the per-batch rounding never scheduled b at all
    positions = [i for i, t in enumerate(order) if t == "b"]
    assert all(later - earlier == 20 for earlier, later in zip(positions, positions[1:], strict=False))


def test_task_aware_after_a_gap_the_returning_type_gets_its_ratio_no_burst() -> None:
    config = TaskScheduler.Config(strategy="task_aware", ratios={"a": 0.7, "b": 0.3}, batch_size=8)
    scheduler = TaskScheduler(config)
    _feed(scheduler, "a", 1000)
    assert _pop(scheduler, 50) == ["a"] * 50  # b has no work: a fills the surplus
    _feed(scheduler, "b", 500)
    after = _pop(scheduler, 100)
    assert after.count("b") == 30 and _longest_run(after, "b") == 1
    assert _longest_run(after, "a") <= 3


def test_task_aware_bursty_type_is_served_at_its_ratio_while_present() -> None:
    config = TaskScheduler.Config(strategy="task_aware", ratios={"a": 0.5, "b": 0.5}, batch_size=8)
    scheduler = TaskScheduler(config)
    _feed(scheduler, "a", 1000)
    order: list[str] = []
    for _ in range(10):
        _feed(scheduler, "b", 4)  # a burst of 4, then nothing for a while
        order += _pop(scheduler, 16)
    assert order.count("b") == 40 and _longest_run(order, "b") == 1
