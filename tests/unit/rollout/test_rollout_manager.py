"""RolloutManager with fakes: concurrency within the pool, groups, staleness, shutdown, failures."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

import pytest

from stacx.rollout.data import ListTaskSource
from stacx.rollout.errors import ConfigError, ResourceDeadlockError
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import (
    FakeEnvironments,
    FakeTokenizer,
    MemoryPublisher,
    ScriptedInference,
    StaticVersion,
)
from stacx.rollout.manager import RolloutManager
from stacx.rollout.resources import Resources
from stacx.rollout.scheduler import TaskScheduler
from stacx.rollout.task_stream import KafkaTaskSource, decode_finished, encode_finished
from stacx.schemas.records import TaskSample, TrajectoryStatus

TOOL_THEN_ANSWER = ("<tool_call>print(6*7)</tool_call>", "<answer>42</answer>")


def _tasks(num: int, task_type: str = "math") -> list[TaskSample]:
    return [
        TaskSample(task_id=f"{task_type}-{i}", task_type=task_type, prompt=f"q{i}", data='{"answer": 42}')
        for i in range(num)
    ]


def _policy(context: str, call: int) -> str:
    # second model turn of an episode: the context already holds a tool response
    return TOOL_THEN_ANSWER[1] if "<tool_response>\n" in context else TOOL_THEN_ANSWER[0]


def _manager(tasks, *, samples=1, envs=None, versions=None, publisher=None, **config):
    tok = FakeTokenizer()
    source = ListTaskSource(tasks, ListTaskSource.Config(samples_per_task=samples))
    cfg = RolloutManager.Config(**config)
    return RolloutManager(
        cfg,
        source=source,
        tokenizer=tok,
        inference=ScriptedInference(tok, _policy),
        publisher=publisher or MemoryPublisher(),
        sandbox=envs or FakeEnvironments(),
        versions=versions,
    )


async def _until(predicate, limit_s: float = 30.0) -> None:
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(wait(), limit_s)


async def test_runs_groups_concurrently_and_publishes_every_sample() -> None:
    envs = FakeEnvironments(delay_s=0.01)
    manager = _manager(_tasks(20), samples=4, envs=envs, max_concurrent_episodes=16)
    summary = await manager.run()
    published = manager.publisher.published
    assert len(published) == 80 and summary.num_groups == 20
    assert summary.by_status == {"COMPLETED": 80}
    by_group = Counter(t.group_id for t in published)
    assert len(by_group) == 20 and set(by_group.values()) == {4}
    assert {t.sample_index for t in published} == {0, 1, 2, 3}
    assert len({t.trajectory_id for t in published}) == 80
    assert 1 < summary.max_concurrent_episodes <= 16
    assert envs.open_sessions == [] and manager.pool.in_use == Resources()
    assert summary.mean_reward_by_type() == {"math": 1.0}


async def test_pool_bounds_concurrency() -> None:
    envs = FakeEnvironments(delay_s=0.01)
    manager = _manager(
        _tasks(12), envs=envs, pool={"sandboxes": 3, "cpu": 3, "memory_mb": 4096, "generations": 1}
    )
    await manager.run()
    assert manager.pool.peak.sandboxes == 3 and manager.summary.max_concurrent_episodes == 3
    assert manager.pool.peak.generations == 1
    assert len(manager.publisher.published) == 12


def test_config_that_could_never_run_is_refused() -> None:
    with pytest.raises(ResourceDeadlockError, match=r"needs 1 sandboxes .* budget has 0"):
        _manager(_tasks(1), pool={"sandboxes": 0, "cpu": 4, "memory_mb": 4096, "generations": 1})


async def test_failures_are_published_and_never_crash_the_manager() -> None:
    envs = FakeEnvironments(fail_exec=True)
    manager = _manager(_tasks(5), envs=envs)
    summary = await manager.run()
    assert summary.by_status == {"FAILED": 5}
    assert all("gateway unreachable" in (t.error or "") for t in manager.publisher.published)
    assert envs.open_sessions == []


async def test_unknown_task_type_without_default_is_failed_not_fatal() -> None:
    evaluators = {"math": Evaluator.Config()}
    manager = _manager(_tasks(2) + _tasks(1, "poetry"), evaluators=evaluators)
    summary = await manager.run()
    assert summary.by_status == {"COMPLETED": 2, "FAILED": 1}
    failed = [t for t in manager.publisher.published if t.status is TrajectoryStatus.FAILED]
    assert "poetry" in (failed[0].error or "")


async def test_staleness_bound_stops_pulling_until_the_policy_advances() -> None:
    versions = StaticVersion(0)
    manager = _manager(_tasks(8), versions=versions, max_staleness=1, train_groups_per_version=2)
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.summary.num_episodes == 4)
    await asyncio.sleep(0.05)  # give it the chance to (wrongly) go further
    assert manager.summary.num_groups == 4 and manager.num_stalls == 1  # (0 + 1 + 1) * 2
    versions.version = 1
    await _until(lambda: manager.summary.num_groups == 6)
    versions.version = 2
    summary = await asyncio.wait_for(run, 30)
    assert summary.num_groups == 8
    assert [t.policy_version for t in manager.publisher.published[-2:]] == [2, 2]


async def test_a_worker_waiting_at_the_bound_keeps_its_group_source_alive(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """While no task is wanted, a consumer-group source is kept alive (its rebalances served):
    otherwise a joining or departing peer waits for this worker's next poll."""
    import stacx.rollout.manager as manager_module

    monkeypatch.setattr(manager_module, "KEEP_ALIVE_S", 0.01)
    versions = StaticVersion(0)
    manager = _manager(_tasks(200), versions=versions, max_staleness=0, train_groups_per_version=1)
    calls: list[int] = []
    manager.source.keep_alive = lambda: calls.append(len(calls))  # type: ignore[attr-defined]
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.num_stalls == 1 and len(calls) >= 3)  # at the bound, the lookahead full
    assert manager.summary.num_groups == 1
    versions.version = 1  # room again: pulling goes on
    await _until(lambda: manager.summary.num_groups == 2)
    manager.stop("cancel")
    await asyncio.wait_for(run, 30)


def _trained_groups(published, statuses=("COMPLETED",)) -> set[str]:
    return {t.group_id for t in published if t.status.value in statuses}


async def test_groups_failed_while_the_gateway_is_down_do_not_hold_the_staleness_bound() -> None:
    """Under `failure_policy: drop` a group whose every episode failed never reaches a batch: had
    it counted against the bound, the trainer would wait forever for a batch that never fills."""
    versions, envs = StaticVersion(0), FakeEnvironments(fail_open=True)  # the gateway is down
    manager = _manager(_tasks(40), samples=2, envs=envs, versions=versions,
                       max_staleness=1, train_groups_per_version=2, max_concurrent_episodes=2,
                       untrained_backoff_s=0.0)
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.summary.by_status.get("FAILED", 0) >= 8)  # 4 whole groups failed
    envs.fail_open = False  # the gateway is back
    await _until(lambda: len(_trained_groups(manager.publisher.published)) == 4, limit_s=5.0)
    await asyncio.sleep(0.05)  # give it the chance to (wrongly) go further
    assert len(_trained_groups(manager.publisher.published)) == 4  # (0 + 1 + 1) * 2 groups to batch
    assert manager.num_untrained_groups >= 4 and manager.num_stalls >= 1
    assert manager.metrics()["untrained_groups"] == manager.num_untrained_groups
    versions.version = 1
    await _until(lambda: len(_trained_groups(manager.publisher.published)) == 6, limit_s=5.0)
    manager.stop("drain")
    await asyncio.wait_for(run, 30)
    assert envs.open_sessions == [] and manager.pool.in_use == Resources()


class _EverySecondOpenFails(FakeEnvironments):
    def __init__(self) -> None:
        super().__init__()
        self.num_opens = 0

    async def open(self, task, **limits):  # type: ignore[no-untyped-def]
        self.num_opens += 1
        self.fail_open = self.num_opens % 2 == 0
        return await super().open(task, **limits)


async def test_a_group_counts_once_it_has_the_trained_episodes_a_batch_needs() -> None:
    """`min_trained_per_group` (the assembler's min_group_size): a group with one completed
    episode of two is dropped there when it needs two, so it does not count; with 1 it does."""
    for needed, groups in ((1, 2), (2, 40)):
        manager = _manager(_tasks(40), samples=2, envs=_EverySecondOpenFails(), versions=StaticVersion(0),
                           max_staleness=0, train_groups_per_version=2, max_concurrent_episodes=1,
                           min_trained_per_group=needed, untrained_backoff_s=0.0)
        run = asyncio.create_task(manager.run())
        await _until(lambda m=manager: m.num_stalls or m.summary.num_episodes == 80)  # type: ignore[misc]
        await asyncio.sleep(0.05)
        assert manager.summary.num_groups == groups, needed
        assert manager.summary.by_status == {"COMPLETED": groups, "FAILED": groups}
        manager.stop("cancel")
        await asyncio.wait_for(run, 30)


async def test_groups_failing_in_a_row_back_off_instead_of_burning_through_the_tasks() -> None:
    """A gateway that is down fails every episode at once: the groups taken in place of failed
    ones wait longer and longer, and the first group with trained episodes ends the wait."""
    envs = FakeEnvironments(fail_open=True)
    manager = _manager(_tasks(400), samples=2, envs=envs, versions=StaticVersion(0), max_staleness=1,
                       train_groups_per_version=2, untrained_backoff_s=0.2, untrained_backoff_max_s=0.4)
    run = asyncio.create_task(manager.run())
    await asyncio.sleep(1.0)
    failed = manager.num_untrained_groups  # waves of <= 4 groups, 0.2 s then 0.4 s apart
    assert 4 <= failed <= 16, failed
    envs.fail_open = False
    await _until(lambda: manager.num_stalls and len(_trained_groups(manager.publisher.published)) == 4)
    assert manager.num_untrained_groups <= failed + 4
    manager.stop("cancel")
    await asyncio.wait_for(run, 30)


async def test_without_a_drop_policy_every_group_counts_against_the_bound() -> None:
    """`trained_statuses: null` (the assembler packs failed episodes, masked or flagged): a
    failed group reaches a batch, so it counts like any other."""
    versions, envs = StaticVersion(0), FakeEnvironments(fail_open=True)
    manager = _manager(_tasks(40), samples=2, envs=envs, versions=versions, max_staleness=1,
                       train_groups_per_version=2, trained_statuses=None)
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.num_stalls == 1)
    await asyncio.sleep(0.05)
    assert manager.summary.num_groups == 4 and manager.num_untrained_groups == 0
    manager.stop("cancel")
    await asyncio.wait_for(run, 30)


async def test_cancel_leaves_no_sandbox_and_no_held_resources() -> None:
    envs = FakeEnvironments(delay_s=3600)
    manager = _manager(_tasks(30), envs=envs, max_concurrent_episodes=10)
    run = asyncio.create_task(manager.run())
    await _until(lambda: len(envs.sessions) == 10 and all(s.commands for s in envs.sessions))
    manager.stop("cancel")
    await asyncio.wait_for(run, 30)
    assert envs.open_sessions == [] and manager.pool.in_use == Resources()
    assert manager.publisher.published == []


async def test_drain_finishes_running_episodes_and_pulls_no_more() -> None:
    envs = FakeEnvironments(delay_s=0.05)
    manager = _manager(_tasks(30), envs=envs, max_concurrent_episodes=5)
    run = asyncio.create_task(manager.run())
    await _until(lambda: len(envs.sessions) >= 5)
    manager.stop("drain")
    summary = await asyncio.wait_for(run, 30)
    assert 5 <= summary.num_episodes < 30
    assert summary.num_episodes == len(envs.sessions) == len(manager.publisher.published)
    assert envs.open_sessions == []


async def test_strategy_from_config_orders_dispatch() -> None:
    tasks = _tasks(3, "math") + _tasks(3, "shell")
    scheduler = TaskScheduler.Config(strategy="fair_share", weights={"math": 1, "shell": 2})
    manager = _manager(tasks, max_concurrent_episodes=1, scheduler=scheduler)
    await manager.run()
    order = [t.task_type for t in manager.publisher.published]
    assert order == ["shell", "math", "shell", "shell", "math", "math"]


async def test_publish_error_is_counted_and_group_not_acked() -> None:
    class Flaky(MemoryPublisher):
        async def publish(self, trajectory):  # type: ignore[no-untyped-def]
            if trajectory.sample_index == 1:
                raise RuntimeError("broker down")
            await super().publish(trajectory)

    acked: list[str] = []
    manager = _manager(_tasks(2), samples=2, publisher=Flaky())
    manager.source.ack = lambda group: _record(acked, group.group_id)  # type: ignore[method-assign]
    summary = await manager.run()
    assert summary.num_publish_errors == 2 and acked == []


async def _record(into: list[str], value: str) -> None:
    into.append(value)


@dataclass
class _Event:
    topic: str
    partition: int
    offset: int
    value: TaskSample


class _FakeConsumer:
    """Hands out `events`; commits (offset, metadata) per partition like the group coordinator."""

    def __init__(self, events: list[_Event], committed: dict | None = None) -> None:
        self.events = events
        self.positions: dict[tuple[str, int], tuple[int, str]] = dict(committed or {})
        self.commits: list[tuple[int, set[int]]] = []
        """(offset, finished offsets above it) of every commit, in order."""

    def poll(self, timeout: float) -> _Event | None:
        return self.events.pop(0) if self.events else None

    def commit_positions(self, positions: dict, *, wait_s: float | None = None) -> None:
        for part, (offset, metadata) in positions.items():
            self.positions[part] = (offset, metadata)
            self.commits.append((offset, decode_finished(offset, metadata)))

    def committed_positions(self, partitions: list) -> dict:
        return {p: self.positions.get(p, (-1, "")) for p in partitions}

    def close(self) -> None:
        pass


def _kafka_source(consumer: _FakeConsumer, **config) -> KafkaTaskSource:  # type: ignore[no-untyped-def]
    source = KafkaTaskSource(KafkaTaskSource.Config(bootstrap_servers="unused", **config), consumer=consumer)
    source.on_assign([("stacx.tasks", 0)])
    return source


async def test_kafka_source_commits_every_finished_task_with_the_gaps_above_the_offset() -> None:
    """Each finished task commits at once: the lowest unfinished offset, and in the metadata the
    finished ones above it (a new owner skips them; nothing waits behind a long episode)."""
    events = [_Event("stacx.tasks", 0, i, t) for i, t in enumerate(_tasks(4))]
    consumer = _FakeConsumer(list(events))
    source = _kafka_source(consumer, samples_per_task=2, max_idle_polls=1)
    groups = [await source.next_group() for _ in range(4)]
    assert all(g is not None and g.num_samples == 2 for g in groups)
    assert await source.next_group() is None
    await source.ack(groups[1])  # offset 0 still runs: commit 0, with 1 finished above it
    assert consumer.commits == [(0, {1})]
    await source.ack(groups[3])
    assert consumer.commits[-1] == (0, {1, 3})
    await source.ack(groups[0])
    assert consumer.commits[-1] == (2, {3})
    await source.ack(groups[2])
    assert consumer.commits[-1] == (4, set())


async def test_a_partition_kept_through_a_rebalance_never_reruns_what_finished_below_its_commit() -> None:
    """An eager rebalance keeps partition 0 here but resets reading to the offset committed on
    revoke (0, while 0 and 1 ran); both finish before the re-read reaches them: neither runs again."""
    events = [_Event("stacx.tasks", 0, i, t) for i, t in enumerate(_tasks(3))]
    consumer = _FakeConsumer([events[0], events[1]])
    source = _kafka_source(consumer)
    first, second = await source.next_group(), await source.next_group()
    source.on_revoke([("stacx.tasks", 0)])
    source.on_assign([("stacx.tasks", 0)])  # kept: reading restarts at the committed offset 0
    assert consumer.positions[("stacx.tasks", 0)][0] == 0
    await source.ack(first)
    await source.ack(second)
    assert consumer.commits[-1] == (2, set())
    consumer.events += [events[0], events[1], events[2]]  # the re-read from offset 0
    third = await source.next_group()
    assert third is not None and third.source_ref.offset == 2


async def test_a_new_owner_skips_the_tasks_finished_above_the_committed_offset() -> None:
    """The partition's previous owner finished offsets 1 and 3 but not 0 and 2: the new owner
    runs 0, 2 and 4 only, and commits past all of them."""
    events = [_Event("stacx.tasks", 0, i, t) for i, t in enumerate(_tasks(5))]
    consumer = _FakeConsumer(list(events), committed={("stacx.tasks", 0): (0, encode_finished(0, {1, 3}))})
    source = _kafka_source(consumer, max_idle_polls=1)
    groups = []
    while (group := await source.next_group()) is not None:
        groups.append(group)
    assert [g.source_ref.offset for g in groups] == [0, 2, 4]
    for group in groups:
        await source.ack(group)
    assert consumer.commits[-1] == (5, set())


def test_finished_offsets_round_trip_through_commit_metadata_within_kafkas_limit() -> None:
    finished = {5, 6, 7, 9, 12, 13}
    text = encode_finished(4, finished)
    assert text.endswith(":1-3,5,8-9") and decode_finished(4, text) == finished
    assert decode_finished(4, "someone else's metadata") == set()
    assert decode_finished(4, "stacx.finished:1-x") == set()
    many = encode_finished(0, range(1, 100_000, 2))  # too many gaps: the lowest ones are kept
    assert len(many) <= 4000 and min(decode_finished(0, many)) == 1


class _StreamSource:
    """Two groups, then blocks like an idle Kafka topic."""

    def __init__(self) -> None:
        self.source = ListTaskSource(_tasks(2), ListTaskSource.Config(samples_per_task=2))
        self.acked: list[str] = []

    async def next_group(self):  # type: ignore[no-untyped-def]
        group = await self.source.next_group()
        if group is None:
            await asyncio.Event().wait()  # an idle stream: never returns
        return group

    async def ack(self, group) -> None:  # type: ignore[no-untyped-def]
        self.acked.append(group.group_id)

    async def close(self) -> None:
        pass


def _stream_manager(source: _StreamSource) -> RolloutManager:
    tok = FakeTokenizer()
    return RolloutManager(
        RolloutManager.Config(),
        source=source,
        tokenizer=tok,
        inference=ScriptedInference(tok, _policy),
        publisher=MemoryPublisher(),
        sandbox=FakeEnvironments(),
    )


async def test_idle_stream_source_does_not_hold_back_pending_work() -> None:
    source = _StreamSource()
    manager = _stream_manager(source)
    summary = await asyncio.wait_for(manager.run(num_groups=2), 30)
    assert summary.num_episodes == 4 and len(source.acked) == 2

    # without a group limit it runs until stopped, then drains
    source = _StreamSource()
    manager = _stream_manager(source)
    run = asyncio.create_task(manager.run())
    await _until(lambda: len(source.acked) == 2)
    manager.stop("drain")
    summary = await asyncio.wait_for(run, 30)
    assert summary.num_episodes == 4


async def test_kafka_source_counts_takeovers_and_skips_its_own_redelivered_tasks() -> None:
    """A rebalance hands this worker a whole new assignment: partitions it did not hold are a
    departed peer's tasks (a takeover); its own unfinished tasks come again from the committed
    offsets and are not run twice."""
    events = [_Event("stacx.tasks", 0, i, t) for i, t in enumerate(_tasks(3))]
    redelivered = [events[0], events[1], events[2]]
    consumer = _FakeConsumer([events[0], events[1], *redelivered])
    source = KafkaTaskSource(
        KafkaTaskSource.Config(bootstrap_servers="unused", max_idle_polls=1), consumer=consumer
    )
    source.on_assign([("stacx.tasks", 0), ("stacx.tasks", 1)])  # the first assignment
    assert source.num_takeovers == 0
    source.on_assign([("stacx.tasks", 0)])  # a peer joined: this worker keeps partition 0
    assert source.num_takeovers == 0 and source.num_revocations == 1
    source.on_assign([("stacx.tasks", 0), ("stacx.tasks", 1)])  # the peer left: its partition
    assert source.num_takeovers == 1
    first, second = await source.next_group(), await source.next_group()
    assert first is not None and second is not None
    await source.ack(second)  # finished, offset 0 still runs
    third = await source.next_group()  # offsets 0 and 1 again, then 2
    assert third is not None and third.source_ref.offset == 2
    assert await source.next_group() is None


async def test_a_revoked_partition_drops_its_look_ahead_and_commits_where_it_stands() -> None:
    """A peer joins and takes partition 1: on revoke this worker commits partition 1 as it stands
    (offset 0 finished), then its not-started task of partition 1 is no longer its own and its
    late ack commits nothing there."""
    places = [(1, 0), (1, 1), (0, 0)]
    events = [_Event("stacx.tasks", p, o, t) for (p, o), t in zip(places, _tasks(3), strict=True)]
    consumer = _FakeConsumer(list(events))
    source = KafkaTaskSource(KafkaTaskSource.Config(bootstrap_servers="unused"), consumer=consumer)
    source.on_assign([("stacx.tasks", 0), ("stacx.tasks", 1)])
    done, ahead, kept = [await source.next_group() for _ in range(3)]
    await source.ack(done)
    assert all(source.owns(g) for g in (ahead, kept))
    source.on_revoke([("stacx.tasks", 0), ("stacx.tasks", 1)])  # eager: everything is revoked
    assert consumer.positions[("stacx.tasks", 1)] == (1, "stacx.finished:")
    source.on_assign([("stacx.tasks", 0)])
    assert not source.owns(ahead) and source.owns(kept)
    commits = len(consumer.commits)
    await source.ack(ahead)  # it ran anyway (it had started): the new owner's commits rule
    assert len(consumer.commits) == commits


async def test_the_manager_drops_groups_whose_partition_moved_before_they_start() -> None:
    """Groups pending in the scheduler when their partition moves to a peer never start here."""
    places = [(0, 0), (1, 0), (1, 1), (0, 1)]
    events = [_Event("stacx.tasks", p, o, t) for (p, o), t in zip(places, _tasks(4), strict=True)]
    consumer = _FakeConsumer(list(events))
    source = KafkaTaskSource(KafkaTaskSource.Config(bootstrap_servers="unused"), consumer=consumer)
    source.on_assign([("stacx.tasks", 0), ("stacx.tasks", 1)])
    manager = _stream_manager(source)  # type: ignore[arg-type]
    for _ in range(4):
        group = await source.next_group()
        assert group is not None
        manager.scheduler.push(group)
    source.on_assign([("stacx.tasks", 0)])
    manager._drop_moved()
    assert manager.num_dropped_moved == 2 and len(manager.scheduler) == 2
    assert {manager.scheduler.pop().source_ref.partition for _ in range(2)} == {0}  # type: ignore[union-attr]


class _TakeoverSource(ListTaskSource):
    """A task source whose group rebalanced (`num_takeovers`), as `KafkaTaskSource` counts it."""

    num_takeovers = 0


class _HeldPublisher(MemoryPublisher):
    """Publishing of the tasks in `held` waits for `release` (their groups stay in flight)."""

    def __init__(self, held: set[str]) -> None:
        super().__init__()
        self.held, self.release = held, asyncio.Event()

    async def publish(self, trajectory):  # type: ignore[no-untyped-def]
        if trajectory.task_id in self.held:
            await self.release.wait()
        await super().publish(trajectory)


def _bound_manager(source: ListTaskSource, publisher: MemoryPublisher, **config) -> RolloutManager:  # type: ignore[no-untyped-def]
    tok = FakeTokenizer()
    return RolloutManager(
        RolloutManager.Config(max_staleness=1, train_groups_per_version=2, **config),
        source=source,
        tokenizer=tok,
        inference=ScriptedInference(tok, _policy),
        publisher=publisher,
        sandbox=FakeEnvironments(),
        versions=StaticVersion(0),
    )


@pytest.mark.parametrize("rebase", [True, False])
async def test_a_takeover_gives_back_the_groups_no_longer_in_flight(rebase: bool) -> None:
    """At the bound (4 groups at version 0), a dead peer's tasks are re-served here: the 2
    finished groups (trained, filtered, or never to be trained) are given back, the 2 still in
    flight keep counting, so exactly 2 more are taken; `rebase_on_takeover: false` keeps waiting."""
    source = _TakeoverSource(_tasks(40))
    publisher = _HeldPublisher({"math-2", "math-3"})
    manager = _bound_manager(source, publisher, rebase_on_takeover=rebase, stall_rebase_s=0)
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.num_stalls == 1 and len(publisher.published) == 2)
    source.num_takeovers = 1
    await asyncio.sleep(0.2)
    assert manager.summary.num_groups == (6 if rebase else 4)
    assert manager.num_rebases == int(rebase) and manager.metrics()["staleness_rebases"] == int(rebase)
    publisher.release.set()  # the held groups finish: still no more than the bound
    await _until(lambda: len(publisher.published) == manager.summary.num_groups)
    await asyncio.sleep(0.1)
    assert manager.summary.num_groups == (6 if rebase else 4)
    manager.stop("cancel")
    await asyncio.wait_for(run, 30)


async def test_a_stall_with_no_new_version_rebases_after_stall_rebase_s() -> None:
    """No version for `stall_rebase_s` at the bound (the groups a version needs died with a
    peer): the finished groups are given back and the worker takes a bound's worth more."""
    publisher = MemoryPublisher()
    manager = _bound_manager(ListTaskSource(_tasks(40)), publisher, stall_rebase_s=0.3)
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.num_stalls == 1)
    await asyncio.sleep(0.1)
    assert manager.summary.num_groups == 4 and manager.num_rebases == 0  # not yet
    await _until(lambda: manager.summary.num_groups == 8, limit_s=5.0)
    await _until(lambda: manager.num_stalls == 2)
    assert manager.num_rebases == 1
    manager.stop("cancel")
    await asyncio.wait_for(run, 30)


async def test_a_new_version_during_a_stall_restarts_the_rebase_wait() -> None:
    """Versions keep coming, each after a short stall: the wait is per stall, never summed."""
    versions = StaticVersion(0)
    tok = FakeTokenizer()
    manager = RolloutManager(
        RolloutManager.Config(max_staleness=1, train_groups_per_version=2, stall_rebase_s=0.4),
        source=ListTaskSource(_tasks(40)),
        tokenizer=tok,
        inference=ScriptedInference(tok, _policy),
        publisher=MemoryPublisher(),
        sandbox=FakeEnvironments(),
        versions=versions,
    )
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.num_stalls == 1)
    for version in range(1, 4):  # a version every 0.25 s, each taking 2 more groups
        await asyncio.sleep(0.25)
        versions.version = version
    await asyncio.sleep(0.25)
    assert manager.num_rebases == 0 and manager.summary.num_groups == 10
    manager.stop("cancel")
    await asyncio.wait_for(run, 30)


def test_a_negative_stall_rebase_is_refused() -> None:
    with pytest.raises(ConfigError, match="stall_rebase_s = -1"):
        RolloutManager.Config(stall_rebase_s=-1)


class _StrandedConsumer(_FakeConsumer):
    """Polls return nothing although the broker counts unread tasks (a partition left paused)."""

    def __init__(self) -> None:
        super().__init__([])
        self.resumed = 0

    def lag(self) -> dict:
        return {("stacx.tasks", 0): 0 if self.resumed else 7, ("stacx.tasks", 1): 0}

    def resume(self) -> None:
        self.resumed += 1


async def test_an_idle_worker_with_unread_tasks_names_the_stall_and_resumes() -> None:
    from stacx.rollout.progress import metrics_line

    consumer = _StrandedConsumer()
    source = _kafka_source(consumer, poll_timeout_s=0.01, stranded_check_s=0.05, max_idle_polls=0)
    manager = _stream_manager(source)  # type: ignore[arg-type]
    pull = asyncio.create_task(source.next_group())
    await _until(lambda: source.unread_tasks == 7)
    assert "STALLED unread_tasks=7" in metrics_line(manager.metrics())
    await _until(lambda: consumer.resumed == 1)  # the resume follows the stall's line (a thread)
    await _until(lambda: source.unread_tasks == 0)  # the next check finds them read
    pull.cancel()


async def test_lost_partitions_are_forgotten_without_a_commit() -> None:
    """The group moved on without this worker (its session expired during a partition): nothing
    is committed there, its look-ahead is not its own any more, and a later assignment of the
    same partition starts from what the group committed, not from this worker's stale view."""
    events = [_Event("stacx.tasks", 0, i, t) for i, t in enumerate(_tasks(2))]
    consumer = _FakeConsumer(list(events))
    source = _kafka_source(consumer)
    ahead = await source.next_group()
    assert ahead is not None and source.owns(ahead)
    source.on_lost([("stacx.tasks", 0)])
    assert consumer.commits == [] and not source.owns(ahead) and source.num_revocations == 1
    consumer.positions[("stacx.tasks", 0)] = (1, encode_finished(1, {2}))  # the other owner's work
    source.on_assign([("stacx.tasks", 0)])
    assert source.num_takeovers == 1
    await source.ack(ahead)  # it had started before the loss: below the group's offset now
    assert consumer.commits == [] and consumer.positions[("stacx.tasks", 0)][0] == 1


async def test_close_commits_where_it_stands_without_waiting_for_brokers_that_are_going() -> None:
    from stacx.rollout.task_stream import CLOSE_COMMIT_WAIT_S

    class Recording(_FakeConsumer):
        waits: list[float | None] = []

        def commit_positions(self, positions: dict, *, wait_s: float | None = None) -> None:
            self.waits.append(wait_s)
            super().commit_positions(positions)

    consumer = Recording([_Event("stacx.tasks", 0, 0, _tasks(1)[0])])
    source = _kafka_source(consumer)
    assert await source.next_group() is not None
    await source.close()
    assert consumer.waits == [CLOSE_COMMIT_WAIT_S] and CLOSE_COMMIT_WAIT_S <= 5
    assert consumer.commits == [(0, set())]  # the running task stays unfinished for the next owner
