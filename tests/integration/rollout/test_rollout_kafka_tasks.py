"""Tasks from a real Kafka topic through a consumer group: every task rolled out once, offsets
committed only after its group is published, so a second worker of the group gets nothing."""

from __future__ import annotations

from stacx.rollout.fakes import FakeEnvironments, FakeTokenizer, MemoryPublisher, ScriptedInference
from stacx.rollout.manager import RolloutManager
from stacx.rollout.task_stream import KafkaTaskSource
from stacx.schemas.records import TaskSample


def _source(bootstrap: str, topic: str, group: str) -> KafkaTaskSource:
    config = KafkaTaskSource.Config(
        bootstrap_servers=bootstrap,
        group_id=group,
        topic=topic,
        samples_per_task=2,
        poll_timeout_s=1.0,
        max_idle_polls=5,
    )
    return KafkaTaskSource(config)


async def test_tasks_topic_feeds_the_manager_and_commits(
    kafka_bootstrap: str, fresh_topic, fresh_group: str
) -> None:
    from stacx.producers import EventProducer

    topic = fresh_topic("tasks", partitions=2)
    tasks = [
        TaskSample(task_id=f"k{i}", task_type="math", prompt=f"{i}+0?", data=f'{{"answer": {i}}}')
        for i in range(6)
    ]
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for task in tasks:
            producer.publish(topic, task, key=task.task_id).result(timeout=30)

    tok = FakeTokenizer()
    publisher = MemoryPublisher()
    source = _source(kafka_bootstrap, topic, fresh_group)
    manager = RolloutManager(
        RolloutManager.Config(),
        source=source,
        tokenizer=tok,
        publisher=publisher,
        inference=ScriptedInference(
            tok, lambda context, call: "<answer>" + context.split("+0?")[0][-1] + "</answer>"
        ),
        sandbox=FakeEnvironments(),
    )
    summary = await manager.run(num_groups=6)
    await manager.close()
    assert summary.num_episodes == 12 and summary.by_status == {"COMPLETED": 12}
    assert sorted({t.task_id for t in publisher.published}) == [t.task_id for t in tasks]
    assert all(t.reward == 1.0 for t in publisher.published)

    second = _source(kafka_bootstrap, topic, fresh_group)  # same group: offsets were committed
    try:
        assert await second.next_group() is None
    finally:
        await second.close()


async def test_a_waiting_worker_kept_alive_lets_a_joining_peer_start_at_once(
    kafka_bootstrap: str, fresh_topic, fresh_group: str
) -> None:
    """A worker with no room for tasks (full, or at its staleness bound) keeps its group alive
    without taking any: a peer joining gets partitions in seconds, not after the waiting
    worker's `max.poll.interval` (5 minutes) — and the waiting one takes nothing meanwhile."""
    import asyncio
    import time

    from stacx.producers import EventProducer

    topic = fresh_topic("tasks", partitions=4)
    tasks = [TaskSample(task_id=f"w{i}", task_type="math", prompt=f"{i}?") for i in range(16)]
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for task in tasks:
            producer.publish(topic, task, key=task.task_id).result(timeout=30)
    waiting, joining = (_source(kafka_bootstrap, topic, fresh_group) for _ in range(2))
    waiting.config.max_idle_polls = joining.config.max_idle_polls = 0
    try:
        first = await asyncio.wait_for(waiting.next_group(), 60)  # joined: every partition is its own
        assert first is not None
        stop = asyncio.Event()

        async def keep_alive() -> None:
            while not stop.is_set():
                await asyncio.to_thread(waiting.keep_alive)
                await asyncio.sleep(0.5)

        alive = asyncio.create_task(keep_alive())
        started = time.monotonic()
        group = await asyncio.wait_for(joining.next_group(), 60)  # the rebalance completed
        joined_s = time.monotonic() - started
        while not waiting._consumer.assignment():  # its share arrives with its next keep-alive poll
            assert time.monotonic() - started < 60, "the kept-alive worker got no partitions back"
            await asyncio.sleep(0.2)
        stop.set()
        await alive
        assert group is not None and joined_s < 60
        assert 0 < len(joining._consumer.assignment()) < 4  # the partitions were shared out
        assert len(waiting._consumer.assignment()) + len(joining._consumer.assignment()) == 4
        # resumed, the kept-alive worker reads its own partitions only
        resumed = await asyncio.wait_for(waiting.next_group(), 60)
        assert resumed is not None
        assert (resumed.source_ref.topic, resumed.source_ref.partition) in set(waiting._consumer.assignment())
    finally:
        await waiting.close()
        await joining.close()
