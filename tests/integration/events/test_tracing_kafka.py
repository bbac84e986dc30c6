"""Trace context on the real broker: every event published with tracing on carries `traceparent`
and its content type and schema fingerprint (raw header read), a replay reads back the same
headers, and a dead letter keeps the original event's context both in its record and in its own
Kafka headers."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition
from events_kafka_helpers import collect, consumer, trajectory
from opentelemetry import trace
from tracing_fixtures import in_memory_tracing

from stacx.producers import EventProducer
from stacx.schemas.codec import SINGLE_OBJECT_CONTENT_TYPE, Codec
from stacx.schemas.records import DeadLetter, Trajectory

TopicFactory = Callable[..., str]


def _producer(bootstrap: str) -> EventProducer:
    return EventProducer(EventProducer.Config(bootstrap_servers=bootstrap))


def raw_headers(bootstrap: str, topic: str, count: int) -> list[dict[str, bytes]]:
    """Headers of the first `count` records of partition 0, read with a bare client (kcat -f '%h')."""
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"raw-{topic}", "enable.auto.commit": False}
    )
    reader.assign([TopicPartition(topic, 0, 0)])
    found: list[dict[str, bytes]] = []
    try:
        for _ in range(120):
            msg = reader.poll(0.5)
            if msg is not None and msg.error() is None:
                found.append(dict(msg.headers() or []))
            if len(found) >= count:
                break
    finally:
        reader.close()
    return found


def test_every_event_carries_traceparent_and_a_replay_reads_back_the_same_context(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("traced")
    with in_memory_tracing() as exported:
        with _producer(kafka_bootstrap) as p:
            for i in range(5):  # no span is active: each publish makes its own
                p.publish(topic, trajectory(i))
        published = {
            s.context.trace_id for s in exported.get_finished_spans() if s.name == f"publish {topic}"
        }
    assert len(published) == 5
    raw = raw_headers(kafka_bootstrap, topic, 5)
    assert len(raw) == 5 and all(h.get("traceparent", b"").startswith(b"00-") for h in raw), raw
    fingerprint = Codec().local_schema(Trajectory).fingerprint.encode()
    assert all(h["content-type"] == SINGLE_OBJECT_CONTENT_TYPE.encode() for h in raw), raw
    assert all(h["stacx-schema-fingerprint"] == fingerprint for h in raw), raw
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        first = {e.value.trajectory_id: e.headers for e in collect(c, 5)}
        c.seek(topic, 0, 0)  # replay the topic from its start
        replayed = collect(c, 5)
    again = {e.value.trajectory_id: e.headers for e in replayed}
    assert len(first) == 5 and again == first  # the trace and the content headers
    first = {t: h["traceparent"] for t, h in first.items()}
    assert {int(v.split(b"-")[1], 16) for v in first.values()} == published
    assert {
        trace.get_current_span(e.trace_context).get_span_context().trace_id for e in replayed
    } == published


def test_a_dead_letter_keeps_the_original_trace_context(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic, dlq = fresh_topic("garbage"), fresh_topic("dlq")
    with in_memory_tracing():
        with _producer(kafka_bootstrap) as p:
            with trace.get_tracer("test").start_as_current_span("episode") as episode:
                p.publish_bytes(topic, b"not an event", key="k")
    original = raw_headers(kafka_bootstrap, topic, 1)[0]["traceparent"]
    assert int(original.split(b"-")[1], 16) == episode.get_span_context().trace_id
    # the consumer runs with tracing off: the context survives because it travels with the event
    with consumer(kafka_bootstrap, fresh_group, topic, dlq) as c:
        assert collect(c, 0, settle_s=3.0) == []
        c.commit()
        assert c.num_dead_letters == 1
    (letter_headers,) = raw_headers(kafka_bootstrap, dlq, 1)
    assert letter_headers["traceparent"] == original
    assert letter_headers["content-type"] == SINGLE_OBJECT_CONTENT_TYPE.encode()  # the letter's own
    assert letter_headers["stacx-schema-fingerprint"] == Codec().local_schema(DeadLetter).fingerprint.encode()
    with consumer(kafka_bootstrap, fresh_group + "-dlq", dlq, None) as d:
        (letter,) = collect(d, 1)
    assert letter.value.headers["traceparent"] == original.decode()
    assert (
        trace.get_current_span(letter.trace_context).get_span_context().trace_id
        == episode.get_span_context().trace_id
    )
