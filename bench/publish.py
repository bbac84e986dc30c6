"""Benchmark: EventProducer vs Kafka's own ProducerPerformance, and decode vs raw consume.

In one run on the local broker (same topic config, same producer settings, acks=all):
publish N trajectories of ~20 KB (2,000 tokens with logprobs) and of ~1 KB with our publisher,
and N records of the same sizes with `org.apache.kafka.tools.ProducerPerformance`; then read
the 20 KB topic back with a raw confluent-kafka consumer and with EventConsumer (decode).

    .venv/bin/python bench/publish.py --json

The last line is one JSON object: records, record_bytes, ours_records_per_s,
limit_records_per_s, ratio (ours/limit, 20 KB case), decode_ratio (decode/raw consume). Target:
ratio >= 0.8. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from consumers import EventConsumer
from producers import EventProducer
from schemas import topics
from schemas.codec import encode
from schemas.records import Trajectory, Turn, logprobs, loss_mask, token_ids

TOOL_CLASS = "org.apache.kafka.tools.ProducerPerformance"
TARGET_RATIO = 0.8
CONSUME_DEADLINE_S = 120.0
OURS = EventProducer.Config()
"""EventProducer defaults: the settings the bench does not vary are mirrored to the Java tool."""


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap: str
    records: int
    compression: str
    linger_ms: int
    batch_size: int
    partitions: int
    jars: Path
    repeat: int


def log(message: str) -> None:
    print(f"[bench.publish] {message}", file=sys.stderr, flush=True)


def jar_dir(override: str | None) -> Path:
    """The Kafka jars: --jars, else infra's jar_dir(), else $STACX_HOME/kafka/libs."""
    if override:
        return Path(override)
    try:
        from infra.services.kafka import jar_dir as infra_jar_dir

        return infra_jar_dir()
    except ImportError:
        home = Path(os.environ.get("STACX_HOME", Path.home() / ".cache" / "stacx"))
        return home / "kafka" / "libs"


def trajectories(count: int, num_tokens: int, text_chars: int) -> list[Trajectory]:
    """`count` distinct trajectories sharing their (random, realistic) token arrays."""
    rng = np.random.default_rng(0)
    ids = token_ids(rng.integers(0, 150_000, num_tokens))
    prompt = num_tokens // 4
    mask = loss_mask(np.r_[np.zeros(prompt), np.ones(num_tokens - prompt)])
    lps = logprobs(np.where(mask == 1, -rng.exponential(0.5, num_tokens), 0.0))
    turns = [
        Turn(role="user", text="x" * (text_chars // 2)),
        Turn(role="assistant", text="y" * (text_chars // 2), policy_version=3),
    ]
    return [
        Trajectory(
            trajectory_id=f"bench-{i:08d}",
            group_id=f"group-{i // 8}",
            sample_index=i % 8,
            task_id=f"task-{i // 8}",
            task_type="bench",
            model_name="bench-model",
            policy_version=3,
            turns=turns,
            token_ids=ids,
            loss_mask=mask,
            logprobs=lps,
            prompt_length=prompt,
            rewards={"correct": 1.0},
            reward=1.0,
        )
        for i in range(count)
    ]


def create_topics(settings: Settings, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    spec = next(t for t in topics.TOPICS if t.name == topics.TRAJECTORIES)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    new = [
        NewTopic(n, num_partitions=settings.partitions, replication_factor=1, config=dict(spec.config))
        for n in names
    ]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)


def delete_topics(settings: Settings, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    for future in admin.delete_topics(names).values():
        try:
            future.result(timeout=30)
        except Exception as exc:  # best effort cleanup
            log(f"could not delete a bench topic: {exc}")


def run_ours(settings: Settings, topic: str, records: list[Trajectory]) -> float:
    config = EventProducer.Config(
        bootstrap_servers=settings.bootstrap,
        client_id="bench-ours",
        compression=settings.compression,
        linger_ms=settings.linger_ms,
        batch_size_bytes=settings.batch_size,
    )
    with EventProducer(config) as producer:
        producer.publish(topic, records[0]).result(timeout=60)  # connect, register schema
        start = time.perf_counter()
        futures = [producer.publish(topic, r) for r in records]
        producer.flush()
        elapsed = time.perf_counter() - start
    failed = sum(f.exception() is not None for f in futures)
    if failed:
        raise SystemExit(f"{failed} records failed to deliver; see the log above")
    return len(records) / elapsed


def run_kafka_tool(settings: Settings, topic: str, record_bytes: int) -> float:
    jars = glob.glob(str(settings.jars / "kafka-tools-*.jar"))
    if not jars:
        raise SystemExit(
            f"no kafka-tools jar in {settings.jars}: run `stacx infra up` (it resolves the "
            "jars) or pass --jars DIR"
        )
    props = [
        f"bootstrap.servers={settings.bootstrap}",
        "acks=all",
        "enable.idempotence=true",
        f"compression.type={settings.compression}",
        f"linger.ms={settings.linger_ms}",
        f"batch.size={settings.batch_size}",
        # librdkafka's message.max.bytes bounds a produce request like Java's max.request.size,
        # and queue.buffering.max.kbytes the local buffer like buffer.memory: give both the same.
        f"max.request.size={OURS.max_message_bytes}",
        f"buffer.memory={OURS.queue_max_kbytes * 1024}",
        "client.id=bench-kafka-tool",
    ]
    cmd = [
        "java",
        "-Xmx2g",
        "-cp",
        f"{settings.jars}/*",
        TOOL_CLASS,
        "--topic",
        topic,
        "--num-records",
        str(settings.records),
        "--record-size",
        str(record_bytes),
        "--throughput",
        "-1",
        "--producer-props",
        *props,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    summary = [line for line in proc.stdout.splitlines() if "records sent" in line]
    if proc.returncode != 0 or not summary:
        raise SystemExit(f"ProducerPerformance failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    match = re.search(r"([\d.]+) records/sec", summary[-1])
    assert match, summary[-1]
    return float(match.group(1))


def consume_raw(settings: Settings, topic: str) -> float:
    from confluent_kafka import Consumer

    group = f"bench-raw-{uuid.uuid4().hex}"
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    rate = _drain(settings, lambda: [m for m in consumer.consume(1000, timeout=1.0) if m.error() is None])
    consumer.close()
    return rate


def consume_decoded(settings: Settings, topic: str) -> float:
    group = f"bench-decode-{uuid.uuid4().hex}"
    config = EventConsumer.Config(
        bootstrap_servers=settings.bootstrap, topics=[topic], group_id=group, dlq_topic=None
    )
    with EventConsumer(config) as consumer:
        return _drain(settings, lambda: consumer.consume(1000, timeout=1.0))


def _drain(settings: Settings, read: Callable[[], list[Any]]) -> float:
    """Records per second from the first batch on (group join excluded) until N were read."""
    count, start = 0, 0.0
    deadline = time.monotonic() + CONSUME_DEADLINE_S
    while count < settings.records:
        if time.monotonic() > deadline:
            raise SystemExit(f"read only {count} of {settings.records} records in {CONSUME_DEADLINE_S:.0f}s")
        batch = read()
        if batch and not start:
            start = time.perf_counter()
        count += len(batch)
    return count / (time.perf_counter() - start)


def measure(settings: Settings, run_id: str, num_tokens: int, text_chars: int, label: str) -> dict[str, Any]:
    records = trajectories(settings.records, num_tokens, text_chars)
    record_bytes = len(encode(records[0]))
    ours_topic, tool_topic = f"bench.publish.{run_id}.{label}.ours", f"bench.publish.{run_id}.{label}.tool"
    create_topics(settings, [ours_topic, tool_topic])
    ours, limit = 0.0, 0.0
    for round_index in range(settings.repeat):  # alternate the order so drift hits both alike
        first_ours = round_index % 2 == 0
        for runner in ("ours", "tool") if first_ours else ("tool", "ours"):
            if runner == "ours":
                rate = run_ours(settings, ours_topic, records)
                ours = max(ours, rate)
            else:
                rate = run_kafka_tool(settings, tool_topic, record_bytes)
                limit = max(limit, rate)
            log(f"{label} round {round_index + 1}: {runner} {rate:,.0f} records/s of {record_bytes} bytes")
    return {
        "record_bytes": record_bytes,
        "ours_records_per_s": round(ours, 1),
        "limit_records_per_s": round(limit, 1),
        "ratio": round(ours / limit, 3),
        "ours_topic": ours_topic,
        "tool_topic": tool_topic,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON figure")
    parser.add_argument("--records", type=int, default=10_000, help="records per case (default 10000)")
    parser.add_argument("--bootstrap", default=os.environ.get(topics.BOOTSTRAP_ENV, topics.DEFAULT_BOOTSTRAP))
    parser.add_argument("--compression", default="lz4", choices=["none", "lz4", "zstd", "snappy", "gzip"])
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=1_000_000, help="batch.size in bytes")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--jars", help="directory with the Kafka tools jars")
    parser.add_argument("--repeat", type=int, default=2, help="rounds per case; the best of each side counts")
    args = parser.parse_args(argv)
    settings = Settings(
        args.bootstrap,
        args.records,
        args.compression,
        args.linger_ms,
        args.batch_size,
        args.partitions,
        jar_dir(args.jars),
        args.repeat,
    )
    run_id = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    large = measure(settings, run_id, num_tokens=2000, text_chars=1500, label="20kb")
    small = measure(settings, run_id, num_tokens=90, text_chars=120, label="1kb")
    log("consuming the 20 KB topic: raw, then decoded")
    raw = consume_raw(settings, large["ours_topic"])
    decoded = consume_decoded(settings, large["ours_topic"])
    delete_topics(
        settings, [large["ours_topic"], large["tool_topic"], small["ours_topic"], small["tool_topic"]]
    )
    figure = {
        "records": settings.records,
        "record_bytes": large["record_bytes"],
        "ours_records_per_s": large["ours_records_per_s"],
        "limit_records_per_s": large["limit_records_per_s"],
        "ratio": large["ratio"],
        "decode_ratio": round(decoded / raw, 3),
        "decode_records_per_s": round(decoded, 1),
        "raw_consume_records_per_s": round(raw, 1),
        "small": {
            k: small[k] for k in ("record_bytes", "ours_records_per_s", "limit_records_per_s", "ratio")
        },
        "target_ratio": TARGET_RATIO,
        "meets_target": large["ratio"] >= TARGET_RATIO,
        "settings": {
            "acks": "all",
            "compression": settings.compression,
            "linger_ms": settings.linger_ms,
            "batch_size": settings.batch_size,
            "max_request_bytes": OURS.max_message_bytes,
            "buffer_bytes": OURS.queue_max_kbytes * 1024,
            "partitions": settings.partitions,
            "repeat": settings.repeat,
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if not args.json:
        log(
            f"20 KB: ours/ProducerPerformance = {figure['ratio']} (target {TARGET_RATIO}); "
            f"1 KB: {small['ratio']}; decode/raw consume = {figure['decode_ratio']}"
        )
    print(json.dumps(figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
