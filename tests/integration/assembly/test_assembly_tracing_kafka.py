"""Trace context and content headers through the real assembler worker (`stacx assemble`, tracing
off in it): the dead letters of an invalid trajectory and of an undecodable event keep the original
`traceparent` in their own Kafka headers and all original headers in the record, and every event
(trajectory, batch, dead letter) names its content type and schema fingerprint in raw headers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from assembly_worker import STOPPED_BY_SIGTERM, AssemblerProcess, consume_records, one_group_config
from confluent_kafka import Consumer, TopicPartition
from opentelemetry import trace
from tracing_fixtures import in_memory_tracing

from stacx.consumers.assembly.testing import make_trajectory
from stacx.producers import EventProducer
from stacx.schemas.codec import SINGLE_OBJECT_CONTENT_TYPE, Codec, decode
from stacx.schemas.records import DeadLetter, TrainingBatch, Trajectory

AVRO = SINGLE_OBJECT_CONTENT_TYPE.encode()


def _raw(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, dict[str, bytes]]]:
    """(value, headers) of the first `count` records of partition 0, as `kcat -f '%h'` reads them."""
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"raw-{topic}", "enable.auto.commit": False}
    )
    reader.assign([TopicPartition(topic, 0, 0)])
    found: list[tuple[bytes, dict[str, bytes]]] = []
    try:
        for _ in range(240):
            msg = reader.poll(0.5)
            if msg is not None and msg.error() is None:
                found.append((msg.value(), dict(msg.headers() or [])))
            if len(found) >= count:
                break
    finally:
        reader.close()
    assert len(found) == count, f"{topic}: {len(found)} of {count} records"
    return found


def _trace_id(headers: dict[str, bytes]) -> int:
    return int(headers["traceparent"].split(b"-")[1], 16)


def _fingerprint(record_type: type) -> bytes:
    return Codec().local_schema(record_type).fingerprint.encode()


def test_assembler_dead_letters_keep_the_original_trace_context_and_content_headers(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str]
) -> None:
    config = one_group_config(fresh_topic, kafka_bootstrap, tmp_path, "trc")
    app_ids.append(config["app_id"])
    trajectories, dlq = config["trajectories_topic"], config["dlq_topic"]
    producer = EventProducer(
        EventProducer.Config(bootstrap_servers=kafka_bootstrap, schemas_topic=config["schemas_topic"])
    )
    nan = make_trajectory("g-bad", 0, reward=float("nan"))
    with in_memory_tracing(), producer, AssemblerProcess(config, tmp_path) as worker:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("episode nan") as nan_episode:  # a writer that skips the check
            producer.publish_bytes(trajectories, producer.codec.encode(nan), key=b"g-bad")
        with tracer.start_as_current_span("episode junk") as junk_episode:
            producer.publish_bytes(trajectories, b"\x00junk", key=b"g-junk")
        for index in range(2):
            producer.publish(trajectories, make_trajectory("g0", index))
        producer.flush(30)
        (batch,) = _raw(kafka_bootstrap, config["batches_topic"], 1)
        letters = _raw(kafka_bootstrap, dlq, 2)
        code, stats = worker.stop()
    assert code == STOPPED_BY_SIGTERM and stats["undecodable"] == 2
    sent = _raw(kafka_bootstrap, trajectories, 4)
    nan_sent, junk_sent = sent[0][1], sent[1][1]
    assert _trace_id(nan_sent) == nan_episode.get_span_context().trace_id
    assert _trace_id(junk_sent) == junk_episode.get_span_context().trace_id
    for _value, headers in sent:  # kcat-style: every trajectory carries its trace and content headers
        assert headers["traceparent"].startswith(b"00-")
    assert [h.get("content-type") for _v, h in sent] == [AVRO, None, AVRO, AVRO]  # junk is no event
    assert all(h["stacx-schema-fingerprint"] == _fingerprint(Trajectory) for _v, h in (sent[0], *sent[2:]))
    assert batch[1]["content-type"] == AVRO
    assert batch[1]["stacx-schema-fingerprint"] == _fingerprint(TrainingBatch)
    assert isinstance(decode(batch[0]), TrainingBatch)

    by_original = {}
    for value, headers in letters:
        letter = decode(value)
        assert isinstance(letter, DeadLetter) and letter.source_topic == trajectories
        # the dead letter's own Kafka headers: the original trace, and its own (DeadLetter) content
        assert headers["content-type"] == AVRO
        assert headers["stacx-schema-fingerprint"] == _fingerprint(DeadLetter)
        assert headers["traceparent"].decode() == letter.headers["traceparent"]
        by_original[letter.key] = (headers, letter)
    nan_headers, nan_letter = by_original[b"g-bad"]
    assert "reward must be finite" in nan_letter.reason
    assert nan_headers["traceparent"] == nan_sent["traceparent"]
    # the record keeps every original header: the trace and the trajectory's content headers
    assert nan_letter.headers == {k: v.decode() for k, v in nan_sent.items()}
    junk_headers, junk_letter = by_original[b"g-junk"]
    assert junk_headers["traceparent"] == junk_sent["traceparent"]
    assert junk_letter.headers == {"traceparent": junk_sent["traceparent"].decode()}
    assert len(consume_records(kafka_bootstrap, dlq, 2, idle_s=1.0)) == 2  # no third letter
