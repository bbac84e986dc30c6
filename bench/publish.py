"""Benchmark: EventProducer vs Kafka's own ProducerPerformance, and decode vs raw consume.

In one run on the local broker (same topic config, same producer settings, acks=all):
publish N distinct trajectories of ~1 KB, ~20 KB (2,000 tokens) and ~1 MB (a long agentic
episode) with our publisher, and N records of the same sizes with
`org.apache.kafka.tools.ProducerPerformance`; then read the 20 KB topic back with a raw
confluent-kafka consumer and with EventConsumer (decode). The raw side only checks each
message's `error()`; EventConsumer builds every field of every record (token arrays as views,
turns, maps, strings: nothing is deferred to first access), validates it and wraps it in a
ConsumedEvent, which is all a real reader (assembler, learner) gets.

Equal payload entropy: every trajectory has its own random token ids, a multi-turn loss mask
(prompt, then assistant turns with sampled logprobs and tool observations without) and its own
text. The Java tool is fed the very same encoded records through `--payload-file` (its payloads
are UTF-8 text, so each byte keeps its low 7 bits and the newline delimiter is remapped: a
little *less* entropy than ours, which favours the tool). Both sides' compressed bytes on the
wire are read back from the broker (the record batches it stores, as the producers sent them).

    .venv/bin/python bench/publish.py --json

The last line is one JSON object: records, record_bytes, ours_records_per_s,
limit_records_per_s, ratio (ours/limit, 20 KB case), wire_bytes_ours / wire_bytes_tool
(compressed bytes of one round of N records, 20 KB case), decode_ratio (decode/raw consume),
and the same figures per case under `cases`. Target: ratio >= 0.8, and decoding (fastavro) at
>= 2,000 records/s of 20 KB: a busy pipeline carries about 100 trajectories/s, so decoding stays
below a twentieth of one core (decode_ratio against the raw consumer is reported, not a target).
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stacx.consumers import EventConsumer
from stacx.producers import EventProducer
from stacx.schemas import topics
from stacx.schemas.codec import encode
from stacx.schemas.records import Trajectory, Turn, logprobs, loss_mask, token_ids

TOOL_CLASS = "org.apache.kafka.tools.ProducerPerformance"
LOG_DIRS_CLASS = "org.apache.kafka.tools.LogDirsCommand"
TARGET_RATIO = 0.8
TARGET_DECODE_RECORDS_PER_S = 2000.0
CONSUME_DEADLINE_S = 120.0
DECODE_ROUNDS = 3
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
        from stacx.infra.services.kafka import jar_dir as infra_jar_dir

        return infra_jar_dir()
    except ImportError:
        home = Path(os.environ.get("STACX_HOME", Path.home() / ".cache" / "stacx"))
        return home / "kafka" / "libs"


VOCAB = 151_936
"""Token id range (Qwen2's vocabulary size): ids are uniform in it, the hardest case for lz4."""
TURN_TOKENS = 200
"""Tokens per assistant turn and per tool observation after the prompt."""


def trajectories(count: int, num_tokens: int, text_chars: int, seed: int = 0) -> list[Trajectory]:
    """`count` distinct trajectories: each with its own random token ids, logprobs and text.

    Layout of a real multi-turn episode: a prompt (a quarter of the tokens, mask 0), then
    assistant turns (mask 1, sampled logprobs) alternating with tool observations (mask 0,
    logprob 0).
    """
    rng = np.random.default_rng(seed)
    prompt = num_tokens // 4
    mask = loss_mask(_turn_layout(num_tokens, prompt))
    ids = rng.integers(0, VOCAB, (count, num_tokens), dtype=np.int32)
    sampled = (-rng.exponential(0.5, (count, num_tokens))).astype(np.float32)
    lps = np.where(mask == 1, sampled, np.float32(0.0)).astype(np.float32)
    return [_trajectory(i, ids[i], mask, lps[i], prompt, _text(rng, text_chars)) for i in range(count)]


def _turn_layout(num_tokens: int, prompt: int) -> np.ndarray:
    position = np.arange(num_tokens) - prompt
    return ((position >= 0) & ((position // TURN_TOKENS) % 2 == 0)).astype(np.uint8)


def _text(rng: np.random.Generator, chars: int) -> list[str]:
    """Two turns of random lowercase words (text compresses about like real prose)."""
    letters = rng.integers(97, 123, chars, dtype=np.uint8)
    letters[rng.random(chars) < 0.18] = 32
    text = letters.tobytes().decode("ascii")
    return [text[: chars // 2], text[chars // 2 :]]


def _trajectory(
    i: int, ids: np.ndarray, mask: np.ndarray, lps: np.ndarray, prompt: int, texts: list[str]
) -> Trajectory:
    return Trajectory(
        trajectory_id=f"bench-{i:08d}",
        group_id=f"group-{i // 8}",
        sample_index=i % 8,
        task_id=f"task-{i // 8}",
        task_type="bench",
        model_name="bench-model",
        policy_version=3,
        turns=[
            Turn(role="user", text=texts[0]),
            Turn(role="assistant", text=texts[1], policy_version=3),
        ],
        token_ids=token_ids(ids),
        loss_mask=mask,
        logprobs=logprobs(lps),
        prompt_length=prompt,
        rewards={"correct": 1.0},
        reward=1.0,
    )


def write_payload_file(path: Path, payloads: list[bytes]) -> None:
    """The tool's `--payload-file`: our encoded records as 7-bit text, one per line.

    ProducerPerformance decodes the file as UTF-8 and splits it on the delimiter, so only bytes
    below 0x80 survive unchanged: each byte keeps its low 7 bits and a newline becomes 0x0B.
    """
    table = bytes((b & 0x7F) if (b & 0x7F) != 0x0A else 0x0B for b in range(256))
    with path.open("wb") as out:
        for payload in payloads:
            out.write(payload.translate(table))
            out.write(b"\n")


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


def run_kafka_tool(settings: Settings, topic: str, payload_file: Path, num_records: int) -> float:
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
        "-Xmx3g",
        "-cp",
        f"{settings.jars}/*",
        TOOL_CLASS,
        "--topic",
        topic,
        "--num-records",
        str(num_records),
        "--payload-file",
        str(payload_file),
        "--throughput",
        "-1",
        "--producer-props",
        *props,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
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


def measure_decode(settings: Settings, topic: str) -> tuple[float, float]:
    """Best of `DECODE_ROUNDS` rounds each of raw and decoded consumption, interleaved: one
    round lasts well under a second, so a busy machine's scheduling decides any single one."""
    raw, decoded = 0.0, 0.0
    for round_index in range(DECODE_ROUNDS):
        raw = max(raw, consume_raw(settings, topic))
        decoded = max(decoded, consume_decoded(settings, topic))
        log(
            f"consume round {round_index + 1}: raw {raw:,.0f}, decoded {decoded:,.0f} records/s (best so far)"
        )
    return raw, decoded


def _drain(settings: Settings, read: Callable[[], list[Any]]) -> float:
    """Records per second after the first batch (group join and first fetch excluded) until
    every round's N records were read (the topic holds `repeat` x N of them)."""
    wanted = settings.records * settings.repeat
    count, counted, start = 0, 0, 0.0
    deadline = time.monotonic() + CONSUME_DEADLINE_S
    while count < wanted:
        if time.monotonic() > deadline:
            raise SystemExit(f"read only {count} of {wanted} records in {CONSUME_DEADLINE_S:.0f}s")
        batch = read()
        count += len(batch)
        if start:
            counted += len(batch)
        elif batch:
            start = time.perf_counter()
    return counted / (time.perf_counter() - start)


@dataclass(frozen=True, slots=True)
class Case:
    label: str
    num_tokens: int
    text_chars: int
    records: int


def measure(settings: Settings, run_id: str, case: Case, workdir: Path) -> dict[str, Any]:
    records = trajectories(case.records, case.num_tokens, case.text_chars)
    payloads = [encode(r) for r in records]
    record_bytes = round(sum(map(len, payloads)) / len(payloads))
    payload_file = workdir / f"{case.label}.payloads"
    write_payload_file(payload_file, payloads)
    del payloads
    ours_topic = f"bench.publish.{run_id}.{case.label}.ours"
    tool_topic = f"bench.publish.{run_id}.{case.label}.tool"
    create_topics(settings, [ours_topic, tool_topic])
    ours, limit = 0.0, 0.0
    for round_index in range(settings.repeat):  # alternate the order so drift hits both alike
        first_ours = round_index % 2 == 0
        for runner in ("ours", "tool") if first_ours else ("tool", "ours"):
            if runner == "ours":
                rate = run_ours(settings, ours_topic, records)
                ours = max(ours, rate)
            else:
                rate = run_kafka_tool(settings, tool_topic, payload_file, case.records)
                limit = max(limit, rate)
            log(f"{case.label} round {round_index + 1}: {runner} {rate:,.0f} records/s of {record_bytes} B")
    payload_file.unlink()
    sizes = topic_sizes(settings, [ours_topic, tool_topic])
    written = settings.repeat * case.records
    return {
        "records": case.records,
        "record_bytes": record_bytes,
        "ours_records_per_s": round(ours, 1),
        "limit_records_per_s": round(limit, 1),
        "ratio": round(ours / limit, 3),
        # one round of N records; ours also wrote one warm-up record per round
        "wire_bytes_ours": round(sizes[ours_topic] * case.records / (written + settings.repeat)),
        "wire_bytes_tool": round(sizes[tool_topic] * case.records / written),
        "ours_topic": ours_topic,
        "tool_topic": tool_topic,
    }


def topic_sizes(settings: Settings, names: list[str]) -> dict[str, int]:
    """Bytes the broker stores per topic: the record batches exactly as the producers sent them
    (compression.type=producer), read with Kafka's LogDirsCommand."""
    cmd = [
        "java", "-cp", f"{settings.jars}/*", LOG_DIRS_CLASS, "--bootstrap-server", settings.bootstrap,
        "--describe", "--topic-list", ",".join(names),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"LogDirsCommand failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    sizes = dict.fromkeys(names, 0)
    for broker in json.loads(line)["brokers"]:
        for log_dir in broker["logDirs"]:
            for part in log_dir["partitions"]:
                topic = part["partition"].rpartition("-")[0]
                if topic in sizes:
                    sizes[topic] += int(part["size"])
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON figure")
    parser.add_argument("--records", type=int, default=10_000, help="records per case (default 10000)")
    parser.add_argument("--mb-records", type=int, default=200, help="records of the 1 MB case (default 200)")
    parser.add_argument("--bootstrap", default=topics.default_bootstrap())
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
    cases = [
        Case("20kb", num_tokens=2000, text_chars=1500, records=settings.records),
        Case("1kb", num_tokens=90, text_chars=120, records=settings.records),
        Case("1mb", num_tokens=110_000, text_chars=8000, records=args.mb_records),
    ]
    with tempfile.TemporaryDirectory(prefix="stacx-bench-publish-") as workdir:
        results = {case.label: measure(settings, run_id, case, Path(workdir)) for case in cases}
    large = results["20kb"]
    raw, decoded = measure_decode(settings, large["ours_topic"])
    delete_topics(settings, [r[k] for r in results.values() for k in ("ours_topic", "tool_topic")])
    keys = ("records", "record_bytes", "ours_records_per_s", "limit_records_per_s", "ratio",
            "wire_bytes_ours", "wire_bytes_tool")  # fmt: skip
    figure = {
        **{k: large[k] for k in keys},
        "decode_ratio": round(decoded / raw, 3),
        "decode_records_per_s": round(decoded, 1),
        "raw_consume_records_per_s": round(raw, 1),
        "cases": {label: {k: r[k] for k in keys} for label, r in results.items()},
        "target_ratio": TARGET_RATIO,
        "target_decode_records_per_s": TARGET_DECODE_RECORDS_PER_S,
        "meets_target": large["ratio"] >= TARGET_RATIO and decoded >= TARGET_DECODE_RECORDS_PER_S,
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
            f"1 KB: {results['1kb']['ratio']}; 1 MB: {results['1mb']['ratio']}; "
            f"decode/raw consume = {figure['decode_ratio']}"
        )
    print(json.dumps(figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
