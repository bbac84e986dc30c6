"""KafkaGapReader on the real broker: where a group reads from, and ranges of records."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

from stacx.consumers.assembly.gaps import KafkaGapReader


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        headers = [("n", str(i).encode())]
        producer.produce(topic, key=b"k", value=f"v{i}".encode(), partition=0, headers=headers)
    assert producer.flush(30) == 0


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def test_start_offset_is_the_committed_one_or_the_earliest(
    kafka_bootstrap: str, fresh_topic: Callable[..., str]
) -> None:
    topic, group = fresh_topic("gaps"), f"test-gaps-{uuid.uuid4().hex[:8]}"
    _produce(kafka_bootstrap, topic, 5)
    reader = KafkaGapReader(kafka_bootstrap, group, timeout_s=15)
    try:
        assert reader.start_offset(topic, 0) == 0  # nothing committed: the earliest retained
        _commit(kafka_bootstrap, group, topic, 3)
        assert reader.start_offset(topic, 0) == 3
    finally:
        reader.close()


def test_read_returns_exactly_the_records_of_the_range(
    kafka_bootstrap: str, fresh_topic: Callable[..., str]
) -> None:
    topic = fresh_topic("gaps")
    _produce(kafka_bootstrap, topic, 6)
    reader = KafkaGapReader(kafka_bootstrap, f"test-gaps-{uuid.uuid4().hex[:8]}", timeout_s=15)
    try:
        found = reader.read(topic, 0, range(1, 4))
        again = reader.read(topic, 0, range(4, 5))  # the reader can be used again
        end = reader.end_offset(topic, 0)
        tail = reader.read(topic, 0, range(4, end + 3))  # up to the end of the partition
    finally:
        reader.close()
    assert end == 6 and [m.offset() for m in tail] == [4, 5]
    assert [(m.offset(), m.value(), m.headers()) for m in found] == [
        (i, f"v{i}".encode(), [("n", str(i).encode())]) for i in (1, 2, 3)
    ]
    assert [m.offset() for m in again] == [4]


def test_records_since_a_time_are_those_of_every_partition_written_from_it(
    kafka_bootstrap: str, fresh_topic: Callable[..., str]
) -> None:
    topic = fresh_topic("gaps", partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    now_ms = int(time.time() * 1000)
    for i in range(4):  # record timestamps a second apart, as producers set them
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2, timestamp=now_ms - 4_000 + 1_000 * i)
    assert producer.flush(30) == 0
    reader = KafkaGapReader(kafka_bootstrap, f"test-gaps-{uuid.uuid4().hex[:8]}", timeout_s=15)
    try:
        since = sorted(m.value() for m in reader.records_since(topic, now_ms - 3_000))
        none = reader.records_since(topic, now_ms + 1_000)
    finally:
        reader.close()
    assert since == [b"v1", b"v2", b"v3"] and none == []
