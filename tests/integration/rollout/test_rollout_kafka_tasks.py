"""Tasks from a real Kafka topic through a consumer group: every task rolled out once, offsets
committed only after its group is published, so a second worker of the group gets nothing."""

from __future__ import annotations

from rollout.data import KafkaTaskSource
from rollout.fakes import FakeEnvironments, FakeTokenizer, MemoryPublisher, ScriptedInference
from rollout.manager import RolloutManager
from schemas.records import TaskSample


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
    from producers import EventProducer

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
