"""Two rollout workers on one tasks topic through a rebalance and the loss of one of them (real
Kafka): every task is rolled out, none is stranded behind a committed offset, and the look-ahead
a worker holds of partitions it gave away is dropped instead of being run twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, MemoryPublisher, ScriptedInference
from stacx.rollout.manager import RolloutManager
from stacx.rollout.scheduler import TaskScheduler
from stacx.rollout.task_stream import KafkaTaskSource
from stacx.schemas.records import TaskSample

NUM_TASKS = 80
MAX_CONCURRENT = 2
LOOKAHEAD = 8


def _worker(bootstrap: str, topic: str, group: str) -> tuple[RolloutManager, MemoryPublisher]:
    source = KafkaTaskSource(
        KafkaTaskSource.Config(bootstrap_servers=bootstrap, group_id=group, topic=topic, poll_timeout_s=0.2)
    )
    tok = FakeTokenizer()
    publisher = MemoryPublisher()
    manager = RolloutManager(
        RolloutManager.Config(
            max_concurrent_episodes=MAX_CONCURRENT,
            scheduler=TaskScheduler.Config(lookahead=LOOKAHEAD),
        ),
        source=source,
        tokenizer=tok,
        publisher=publisher,
        inference=ScriptedInference(tok, lambda context, call: "<answer>1</answer>", delay_s=0.4),
        sandbox=FakeEnvironments(),
    )
    return manager, publisher


async def _until(predicate: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.1)


async def test_tasks_follow_the_assignment_through_a_rebalance_and_a_lost_peer(
    kafka_bootstrap: str, fresh_topic, fresh_group: str
) -> None:
    from stacx.producers import EventProducer

    topic = fresh_topic("tasks", partitions=4)
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for i in range(NUM_TASKS):
            task = TaskSample(task_id=f"t{i}", task_type="math", prompt=f"{i}?")
            producer.publish(topic, task, key=task.task_id)
        producer.flush(30)
    first, first_out = _worker(kafka_bootstrap, topic, fresh_group)
    first_run = asyncio.create_task(first.run())
    try:
        # the first worker owns every partition and holds a full look-ahead when the second joins
        await _until(lambda: len(first_out.published) >= 4, 60, lambda: "the first worker published nothing")
        second, second_out = _worker(kafka_bootstrap, topic, fresh_group)
        second_run = asyncio.create_task(second.run())
        await _until(lambda: len(second_out.published) >= 6, 60, lambda: "the joining worker got no tasks")
        # the second host is lost: it leaves the group with its look-ahead unfinished
        second.stop("cancel")
        await asyncio.wait_for(second_run, 30)
        await second.close()

        def done() -> set[str]:
            return {t.task_id for t in first_out.published + second_out.published}

        await _until(
            lambda: len(done()) == NUM_TASKS,
            90,
            lambda: f"{NUM_TASKS - len(done())} of {NUM_TASKS} tasks stranded after the rebalance",
        )
    finally:
        first.stop("cancel")
        await asyncio.gather(first_run, return_exceptions=True)
        await first.close()
    both = Counter(t.task_id for t in first_out.published + second_out.published)
    twice = sorted(task for task, n in both.items() if n > 1)
    # only episodes the first worker had running on the partitions it gave away may run again
    # (the lost one's were cancelled, never published), never a look-ahead nor a finished task
    assert len(twice) <= MAX_CONCURRENT, f"{len(twice)} tasks rolled out twice: {twice}"
