"""Event plane on the real broker: exactly-once read-back, duplicates, dead letters, replay,
claim check, catalogue resolution, Confluent wire format, trace context, lag."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from events_kafka_helpers import collect, consumer, trajectory
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from stacx.consumers import CommitRefusedError, ConsumerError, Deduplicator, EventConsumer
from stacx.producers import EventProducer
from stacx.schemas.catalogue import SchemaCatalogue, catalogue_codec
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import Codec, builtin_schemas, load_schema
from stacx.schemas.errors import RecordValidationError
from stacx.schemas.records import DeadLetter, Feedback, Trajectory, logprobs, loss_mask, now_ms, token_ids

TopicFactory = Callable[..., str]
COMPACTED = {"cleanup.policy": "compact"}


def producer(bootstrap: str, **kw: object) -> EventProducer:
    return EventProducer(EventProducer.Config(bootstrap_servers=bootstrap, **kw))  # type: ignore[arg-type]


def test_ten_thousand_trajectories_read_back_exactly_once(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("trajectories", partitions=4)
    with producer(kafka_bootstrap) as p:
        futures = [
            p.publish(
                topic,
                trajectory(
                    i,
                    token_ids=token_ids([i, i + 1]),
                    loss_mask=loss_mask([0, 1]),
                    logprobs=logprobs([0, -0.5]),
                ),
            )
            for i in range(10_000)
        ]
        p.flush()
    assert all(f.exception(timeout=0) is None for f in futures)
    assert len({(f.result().partition, f.result().offset) for f in futures}) == 10_000
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        events = collect(c, 10_000)
        counts = Counter(e.value.trajectory_id for e in events)
        assert len(events) == 10_000 and len(counts) == 10_000
        assert all(
            e.value.token_ids.tolist() == [e.value.sample_index, e.value.sample_index + 1] for e in events
        )
        c.commit()
        assert c.total_lag() == 0 and c.num_dead_letters == 0


def test_republished_duplicate_is_recognised_by_id(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("duplicates")
    with producer(kafka_bootstrap) as p:
        for i in (1, 2, 1):
            p.publish(topic, trajectory(i))
    dedup = Deduplicator()
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        events = collect(c, 3)
    assert [dedup.is_duplicate(e) for e in events] == [False, False, True]
    assert events[0].value.trajectory_id == events[2].value.trajectory_id


UNKNOWN_SCHEMA = {
    "type": "record",
    "name": "Mystery",
    "namespace": "elsewhere",
    "fields": [{"name": "x", "type": "string"}],
}


@dataclasses.dataclass
class Mystery:
    x: str


def test_garbage_unknown_schema_and_invalid_records_go_to_the_dlq(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic, dlq = fresh_topic("mixed"), fresh_topic("dlq")
    unregistered = Codec(schemas=[load_schema(UNKNOWN_SCHEMA)], classes={"elsewhere.Mystery": Mystery})
    with producer(kafka_bootstrap) as p:
        p.publish(topic, trajectory(1))
        p.publish_bytes(topic, b"garbage bytes", key="k-garbage")
        p.publish_bytes(topic, unregistered.encode(Mystery("?")), key="k-unknown")
        invalid = trajectory(2, token_ids=token_ids([1, 2, 3]))
        with pytest.raises(RecordValidationError, match="same length"):  # refused by the producer
            p.publish(topic, invalid)
        # what a writer without that check (an older or foreign producer) would still send
        p.publish_bytes(topic, p.codec.encode(invalid), key="k-invalid")
        p.publish(topic, trajectory(3))
    with consumer(kafka_bootstrap, fresh_group, topic, dlq) as c:
        good = collect(c, 2)
        c.commit()
        assert c.num_dead_letters == 3
    assert [e.value.trajectory_id for e in good] == ["traj-000001", "traj-000003"]
    with consumer(kafka_bootstrap, fresh_group + "-dlq", dlq, None) as d:
        letters = [e.value for e in collect(d, 3)]
    assert all(isinstance(letter, DeadLetter) for letter in letters)
    assert [(x.source_topic, x.source_offset, x.key) for x in letters] == [
        (topic, 1, b"k-garbage"),
        (topic, 2, b"k-unknown"),
        (topic, 3, b"k-invalid"),
    ]
    assert "not a STACX event" in letters[0].reason
    assert "unknown writer schema" in letters[1].reason and letters[1].error_type == "UnknownSchemaError"
    assert "same length" in letters[2].reason and letters[2].error_type == "RecordValidationError"
    assert letters[0].value == b"garbage bytes"


def test_replay_from_timestamp_returns_exactly_the_later_records(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("replay", partitions=3)
    with producer(kafka_bootstrap) as p:
        for i in range(30):
            p.publish(topic, trajectory(i))
        p.flush()
        time.sleep(0.05)
        since = now_ms()
        time.sleep(0.05)
        for i in range(30, 50):
            p.publish(topic, trajectory(i))
    later = {f"traj-{i:06d}" for i in range(30, 50)}
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        c.seek_to_timestamp(since)  # before assignment: applied when partitions arrive
        first = collect(c, 20)
        assert sorted(e.value.trajectory_id for e in first) == sorted(later)
        assert all(e.timestamp_ms >= since for e in first)
        c.seek_to_timestamp(since)  # while assigned: seeks at once
        again = collect(c, 20)
        assert sorted(e.value.trajectory_id for e in again) == sorted(later)


def test_five_megabyte_trajectory_round_trips_through_the_claim_check(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    topic = fresh_topic("large", config={"max.message.bytes": "1048576"})
    n = 550_000  # 9 bytes per token: ~5 MB
    rng = np.random.default_rng(0)
    big = trajectory(
        7,
        token_ids=rng.integers(0, 150_000, n, dtype=np.int32),
        loss_mask=rng.integers(0, 2, n, dtype=np.uint8),
        logprobs=rng.standard_normal(n).astype(np.float32),
    )
    with producer(kafka_bootstrap, blob_store_url=str(tmp_path)) as p:
        p.publish(topic, big).result(timeout=60)
    assert len(list(tmp_path.rglob("*.avro"))) == 1
    assert list(tmp_path.rglob("*.avro"))[0].stat().st_size > 4_900_000
    with consumer(kafka_bootstrap, fresh_group + "-raw", topic, None, resolve_claim_checks=False) as raw:
        (ref,) = collect(raw, 1, settle_s=0)
    assert isinstance(ref.value, ClaimCheck) and ref.value.record_id == "traj-000007"
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        (event,) = collect(c, 1)
    got = event.value
    assert isinstance(got, Trajectory) and got.trajectory_id == "traj-000007"
    assert np.array_equal(got.token_ids, big.token_ids) and np.array_equal(got.logprobs, big.logprobs)
    assert np.array_equal(got.loss_mask, big.loss_mask)


@dataclasses.dataclass(kw_only=True)
class FeedbackWithChannel:
    session_id: str
    reward: float
    interaction_id: str | None = None
    components: dict[str, float] = dataclasses.field(default_factory=dict)
    source: str = "user"
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    created_at_ms: int = 0
    channel: str = "web"


def test_reader_resolves_a_newer_writer_schema_from_the_catalogue(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic, schemas_topic = fresh_topic("evolved"), fresh_topic("schemas", config=COMPACTED)
    current = next(i for i in builtin_schemas() if i.name == "stacx.Feedback")
    newer = copy.deepcopy(current.schema)
    newer["fields"].append({"name": "channel", "type": "string", "default": "web"})
    catalogue = SchemaCatalogue(
        SchemaCatalogue.Config(bootstrap_servers=kafka_bootstrap, topic=schemas_topic)
    )
    writer = Codec(
        schemas=[load_schema(newer)],
        classes={"stacx.Feedback": FeedbackWithChannel},
        on_new_schema=catalogue.register,
    )
    data = writer.encode(FeedbackWithChannel(session_id="s1", reward=0.5, channel="mobile"))
    catalogue.close()
    assert load_schema(newer).fingerprint != current.fingerprint
    with producer(kafka_bootstrap, register_schemas=False) as p:
        p.publish_bytes(topic, data, key="s1")
    with consumer(kafka_bootstrap, fresh_group, topic, None, schemas_topic=schemas_topic) as c:
        (event,) = collect(c, 1)
    assert isinstance(event.value, Feedback) and event.value.reward == 0.5
    assert event.value.session_id == "s1"


def test_confluent_wire_format_end_to_end(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic, registry = fresh_topic("confluent"), "mock://events-integration"
    with producer(kafka_bootstrap, schema_registry_url=registry) as p:
        p.publish(topic, trajectory(5)).result(timeout=30)
    with consumer(kafka_bootstrap, fresh_group + "-raw", topic, None, schema_registry_url=registry) as c:
        (event,) = collect(c, 1)
    assert event.value.trajectory_id == "traj-000005"


def test_trace_context_travels_in_headers(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("traced")
    tracer = TracerProvider().get_tracer("events-integration")
    with producer(kafka_bootstrap) as p, tracer.start_as_current_span("rollout") as span:
        p.publish(topic, trajectory(1), headers={"origin": "test"}).result(timeout=30)
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        (event,) = collect(c, 1)
    assert event.headers["origin"] == b"test" and "traceparent" in event.headers
    carried = trace.get_current_span(event.trace_context).get_span_context()
    assert carried.trace_id == span.get_span_context().trace_id


def test_lag_counts_unconsumed_events(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("lag")
    with producer(kafka_bootstrap) as p:
        for i in range(10):
            p.publish(topic, trajectory(i))
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        first = c.poll(timeout=30)
        assert first is not None and c.total_lag() == 9
        rest = collect(c, 9)
        assert len(rest) == 9 and c.lag() == {(topic, 0): 0}


def test_seeks_before_assignment_apply_per_partition(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("seeks", partitions=2)
    with producer(kafka_bootstrap) as p:
        for i in range(20):
            p.publish(topic, trajectory(i), key=f"k{i}")
    with consumer(kafka_bootstrap, fresh_group + "-all", topic, None) as c:
        by_partition = Counter(e.partition for e in collect(c, 20))
    with consumer(kafka_bootstrap, fresh_group, topic, None) as c:
        c.seek(topic, 0, by_partition[0] - 2)
        c.seek(topic, 1, by_partition[1] - 3)
        events = collect(c, 5)
    assert sorted(Counter(e.partition for e in events).items()) == [(0, 2), (1, 3)]


def test_a_valid_event_of_the_wrong_type_is_dead_lettered_with_its_headers(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic, dlq = fresh_topic("typed"), fresh_topic("dlq")
    with producer(kafka_bootstrap) as p:
        p.publish(topic, Feedback(session_id="s", reward=1.0), key="k-feedback",
                  headers={"origin": "canary"})
        p.publish(topic, trajectory(1))
    config = EventConsumer.Config(bootstrap_servers=kafka_bootstrap, group_id=fresh_group,
                                  topics=[topic], dlq_topic=dlq)
    with EventConsumer(config, expected=Trajectory) as c:
        good = collect(c, 1)
        c.commit()
        assert c.num_dead_letters == 1
    assert [e.value.trajectory_id for e in good] == ["traj-000001"]
    with consumer(kafka_bootstrap, fresh_group + "-dlq", dlq, None) as d:
        (letter,) = [e.value for e in collect(d, 1)]
    assert letter.error_type == "UnexpectedRecordError" and "a Feedback event" in letter.reason
    assert letter.key == b"k-feedback" and letter.headers["origin"] == "canary"


def test_failed_dead_letters_block_the_commit(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("dlq-missing")
    with producer(kafka_bootstrap) as p:
        p.publish_bytes(topic, b"garbage bytes")
    # a DLQ topic name Kafka refuses: the dead letter cannot be delivered
    with consumer(kafka_bootstrap, fresh_group, topic, "invalid topic name!") as c:
        assert collect(c, 0, settle_s=3.0) == [] and c.num_dead_letters == 1
        with pytest.raises(ConsumerError, match="not acknowledged"):
            c.commit()
    with consumer(kafka_bootstrap, fresh_group, topic, None) as again:  # nothing was committed
        assert collect(again, 0, settle_s=3.0) == [] and again.num_dead_letters == 1


def test_catalogue_codec_registers_before_first_use(kafka_bootstrap: str, fresh_topic: TopicFactory) -> None:
    config = SchemaCatalogue.Config(
        bootstrap_servers=kafka_bootstrap, topic=fresh_topic("schemas", config=COMPACTED)
    )
    data = catalogue_codec(config).encode(trajectory(1))
    reader = SchemaCatalogue(config)
    reader.refresh()
    assert [i.fingerprint for i in reader.registered()] == [data[2:10].hex()]
    assert catalogue_codec(config).decode(data, Trajectory).trajectory_id == "traj-000001"


def test_a_commit_after_the_group_moved_on_is_refused_and_nothing_is_lost(
    kafka_bootstrap: str, fresh_topic: TopicFactory, fresh_group: str
) -> None:
    topic = fresh_topic("evicted", partitions=1)
    with producer(kafka_bootstrap) as p:
        for i in range(3):
            p.publish(topic, trajectory(i)).result(timeout=30)
    with consumer(kafka_bootstrap, fresh_group, topic, None, session_timeout_ms=6000,
                  max_poll_interval_ms=6000) as evicted:
        events = collect(evicted, 3, settle_s=0.5)
        time.sleep(9)  # no read for longer than max.poll.interval: librdkafka leaves the group
        with pytest.raises(CommitRefusedError, match="the group moved on") as refused:
            evicted.commit(events)
        assert refused.value.retriable
    with consumer(kafka_bootstrap, fresh_group, topic, None) as owner:  # redelivered to the owner
        assert [e.value.trajectory_id for e in collect(owner, 3)] == [f"traj-{i:06d}" for i in range(3)]
