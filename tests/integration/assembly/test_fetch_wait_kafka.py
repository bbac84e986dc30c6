"""The worker's Kafka consumer on the real broker: its fetches wait at most `fetch_max_wait_ms`.

aiokafka keeps one fetch in flight per broker; Faust asks the broker to hold a fetch up to 1,500 ms
when its partitions are quiet, which kept the busy partitions from being fetched again meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.protocol.fetch import FetchRequest

from stacx.consumers.assembly import AssemblerApp


async def test_fetch_requests_on_a_quiet_partition_carry_the_configured_wait(
    kafka_bootstrap: str, fresh_topic: Callable[..., str]
) -> None:
    topic = fresh_topic("asm-quiet")
    config = AssemblerApp.Config(partitions=1, bootstrap_servers=kafka_bootstrap, fetch_max_wait_ms=120)
    app = AssemblerApp(config, forwarder=None).app
    consumer = app.consumer._thread._create_worker_consumer(app.transport)  # type: ignore[attr-defined]
    waits: list[int] = []
    await consumer.start()
    try:
        send = consumer._client.send

        async def recording_send(node_id: int, request: Any, **kwargs: Any) -> Any:
            if isinstance(request, FetchRequest):
                waits.append(request._max_wait_ms)  # the max_wait_time the broker is sent
            return await send(node_id, request, **kwargs)

        consumer._client.send = recording_send
        consumer.assign([TopicPartition(topic, 0)])
        assert await consumer.getmany(timeout_ms=1000) == {}  # nothing to read: the fetches wait
    finally:
        await consumer.stop()
    assert waits, "no fetch request was sent"
    assert set(waits) == {120}
