"""Kafka client steps run inside one namespaced host of a cluster lab (`bench/cluster.py`,
tests/integration/infra/test_kafka_cluster.py): one JSON line on stdout per call.

    python bench/cluster_client.py CLUSTER.yaml wait N TIMEOUT_S  # until N brokers answer
    python bench/cluster_client.py CLUSTER.yaml create            # the run's topics, by the topic policy
    python bench/cluster_client.py CLUSTER.yaml describe TOPIC    # replicas, in-sync replicas, min ISR
    python bench/cluster_client.py CLUSTER.yaml produce TOPIC FIRST COUNT   # acks=all, as the producers
    python bench/cluster_client.py CLUSTER.yaml keys TOPIC        # distinct keys read back
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx.infra.pipeline import load_spec  # noqa: E402
from stacx.infra.pipeline.layout import RunLayout  # noqa: E402


def wait(spec: Any, brokers: int, timeout_s: float) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": spec.bootstrap_servers, "log_level": 0})
    t0, seen = time.monotonic(), 0
    while time.monotonic() - t0 < timeout_s:
        try:
            seen = len(admin.list_topics(timeout=5).brokers)
        except Exception:  # not answering yet
            seen = 0
        if seen >= brokers:
            break
        time.sleep(1.0)
    return {"brokers": seen, "wait_s": round(time.monotonic() - t0, 1)}


def create(spec: Any) -> dict[str, Any]:
    from stacx.infra.services.topics import ensure_topics

    layout = RunLayout.create(spec)
    specs = layout.topics.specs(spec.topics)
    ensure_topics(spec.bootstrap_servers, specs, spec.topics)
    return {"topics": [s.name for s in specs]}


def describe(spec: Any, topic: str) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": spec.bootstrap_servers})
    meta = admin.list_topics(topic, timeout=30).topics[topic]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    return {
        "partitions": {
            str(p): {"replicas": sorted(m.replicas), "isr": sorted(m.isrs), "leader": m.leader}
            for p, m in meta.partitions.items()
        },
        "min_insync_replicas": int(configs["min.insync.replicas"].value),
        "brokers": sorted(admin.list_topics(timeout=30).brokers),
    }


def produce(spec: Any, topic: str, first: int, count: int) -> dict[str, Any]:
    """`count` records keyed `first..`, with the product producers' librdkafka settings."""
    from confluent_kafka import Producer

    from stacx.producers.event_producer import EventProducer

    settings = EventProducer._librdkafka_config(
        EventProducer.Config(bootstrap_servers=spec.bootstrap_servers)
    )
    producer = Producer({**settings, "message.timeout.ms": 120_000})
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    t0 = time.monotonic()
    for i in range(first, first + count):
        producer.produce(topic, key=str(i).encode(), value=f"record {i}".encode(), on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(180)
    return {
        "acks": settings["acks"],
        "sent": count,
        "errors": errors[:5],
        "failed": len(errors) + left,
        "wall_s": round(time.monotonic() - t0, 2),
    }


def keys(spec: Any, topic: str) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": spec.bootstrap_servers,
            "group.id": f"stacx-lab-read-{time.time_ns()}",
            "enable.auto.commit": False,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=30)[1] for p in parts}
        consumer.assign(parts)
        seen: list[str] = []
        todo = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            seen.append(msg.key().decode())
            if msg.offset() + 1 >= ends[msg.partition()]:
                todo.discard(msg.partition())
        return {"records": len(seen), "distinct": len(set(seen)), "unread_partitions": sorted(todo)}
    finally:
        consumer.close()


def main() -> int:
    path, action, *rest = sys.argv[1:]
    spec = load_spec(path, check=False)
    if action == "wait":
        out = wait(spec, int(rest[0]), float(rest[1]))
    elif action == "create":
        out = create(spec)
    elif action == "describe":
        out = describe(spec, rest[0])
    elif action == "produce":
        out = produce(spec, rest[0], int(rest[1]), int(rest[2]))
    elif action == "keys":
        out = keys(spec, rest[0])
    else:
        print(f"cluster_client: unknown action {action!r}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
