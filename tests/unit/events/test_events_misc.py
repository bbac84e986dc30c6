"""Confluent wire format, content headers, deduplication, validation, trace headers, blob store."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from events_strategies import trajectory
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from stacx.consumers import Deduplicator
from stacx.producers import FsspecBlobStore, InMemoryPublisher, context_from_headers, trace_headers
from stacx.producers.errors import BlobStoreError
from stacx.producers.event_producer import registry_client
from stacx.schemas.codec import (
    CONFLUENT_CONTENT_TYPE,
    CONTENT_TYPE_HEADER,
    SCHEMA_FINGERPRINT_HEADER,
    SINGLE_OBJECT_CONTENT_TYPE,
    Codec,
    decode,
)
from stacx.schemas.errors import CodecError, RecordValidationError
from stacx.schemas.identity import record_id, record_key
from stacx.schemas.records import Feedback, TrainingBatch, Trajectory, logprobs, loss_mask, token_ids
from stacx.schemas.validation import record_problems, validate


def test_confluent_wire_format_with_mock_registry() -> None:
    registry = registry_client("mock://events-unit")
    data = Codec(registry=registry).encode(trajectory(3))
    assert data[0] == 0
    schema_id = int.from_bytes(data[1:5], "big")
    assert registry.get_latest_version("stacx.Trajectory").schema_id == schema_id
    assert Codec(registry=registry).decode(data, Trajectory).trajectory_id == "traj-3"
    with pytest.raises(CodecError, match="schema_registry_url"):
        decode(data)


def test_content_headers_name_the_framing_and_the_writer_schema() -> None:
    codec = Codec()
    fingerprint = codec.local_schema(Trajectory).fingerprint.encode()
    assert codec.content_headers(codec.encode(trajectory(1))) == [
        (CONTENT_TYPE_HEADER, SINGLE_OBJECT_CONTENT_TYPE.encode()),
        (SCHEMA_FINGERPRINT_HEADER, fingerprint),
    ]
    confluent = Codec(registry=registry_client("mock://content-headers"))
    assert confluent.content_headers(confluent.encode(trajectory(1))) == [
        (CONTENT_TYPE_HEADER, CONFLUENT_CONTENT_TYPE.encode()),
        (SCHEMA_FINGERPRINT_HEADER, fingerprint),
    ]
    assert codec.content_headers(b"\x00\x00\x00\x00\x07 foreign registry") == []  # id unknown here
    assert codec.content_headers(b"not an event") == [] and codec.content_headers(b"") == []


def test_deduplicator_recognises_ids_and_forgets_the_oldest() -> None:
    dedup = Deduplicator(capacity=2)
    assert [dedup.is_duplicate(trajectory(i)) for i in (1, 2, 1)] == [False, False, True]
    dedup.is_duplicate(trajectory(3))  # evicts traj-2 (traj-1 was refreshed)
    assert dedup.seen("traj-1") and not dedup.seen("traj-2")
    assert dedup.num_duplicates == 2


def test_identity_defaults() -> None:
    assert record_key(trajectory(1)) == "g" and record_id(trajectory(1)) == "traj-1"
    assert record_id(object()) == "" and record_key(object()) is None


def test_validation_lists_every_problem() -> None:
    bad = trajectory(token_ids=token_ids([1, 2]), prompt_length=5)
    assert len(record_problems(bad)) == 2
    with pytest.raises(RecordValidationError, match="same length"):
        validate(bad)
    batch = TrainingBatch(
        batch_id="b",
        model_name="m",
        trajectory_ids=["a"],
        group_ids=["g"],
        task_types=["x"],
        policy_versions=np.zeros(1, np.int32),
        offsets=np.zeros(1, np.int32),
        lengths=np.array([4], np.int32),
        prompt_lengths=np.zeros(1, np.int32),
        token_ids=np.zeros(2, np.int32),
        loss_mask=np.zeros(2, np.uint8),
        logprobs=np.zeros(2, np.float32),
        rewards=np.zeros(1, np.float32),
    )
    assert record_problems(batch) == ["a sequence extends past the end of token_ids"]


def test_non_finite_rewards_and_logprobs_are_named() -> None:
    bad = trajectory(
        1, reward=float("nan"), rewards={"style": float("inf")}, token_ids=token_ids([1, 2, 3]),
        loss_mask=loss_mask([0, 1, 1]), logprobs=logprobs([0.0, -np.inf, -0.1]),
    )
    problems = record_problems(bad)
    assert "reward must be finite, got [0]=nan" in problems
    assert any(p.startswith("logprobs must be finite, got [1]=-inf") for p in problems)
    assert "rewards must be finite, got {'style': inf}" in problems
    feedback = Feedback(session_id="s", reward=float("inf"))
    assert record_problems(feedback) == ["reward must be finite, got [0]=inf"]
    assert record_problems(trajectory(2)) == []


def test_publishers_refuse_a_nan_reward_before_sending() -> None:
    publisher = InMemoryPublisher()
    with pytest.raises(RecordValidationError, match="invalid Trajectory: reward must be finite"):
        publisher.publish("t", trajectory(1, reward=float("nan")))
    assert publisher.topics == {}
    lenient = InMemoryPublisher(validate_records=False)  # an older or foreign writer
    lenient.publish("t", trajectory(1, reward=float("nan")))
    assert len(lenient.topics["t"]) == 1


def test_trace_context_round_trips_through_headers() -> None:
    tracer = TracerProvider().get_tracer("events-test")
    assert trace_headers() == []
    with tracer.start_as_current_span("publish") as span:
        headers = trace_headers()
    assert headers[0][0] == "traceparent"
    extracted = trace.get_current_span(context_from_headers(headers)).get_span_context()
    assert extracted.trace_id == span.get_span_context().trace_id
    assert extracted.span_id == span.get_span_context().span_id


def test_blob_store_round_trip_and_corruption(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = FsspecBlobStore(str(tmp_path))
    url, digest = store.put(b"payload", prefix="topic")
    assert FsspecBlobStore.get(url, sha256=digest) == b"payload"
    with pytest.raises(BlobStoreError, match="SHA-256"):
        FsspecBlobStore.get(url, sha256="0" * 64)
    with pytest.raises(BlobStoreError, match="cannot read"):
        FsspecBlobStore.get(str(tmp_path / "missing.avro"))


def test_in_memory_publisher_and_consumer_mirror_the_kafka_pair() -> None:
    from stacx.consumers import EventSource, InMemoryConsumer
    from stacx.producers import InMemoryPublisher, Publisher

    publisher: Publisher = InMemoryPublisher()
    assert isinstance(publisher, InMemoryPublisher)
    assert publisher.publish("t", trajectory(1)).result().offset == 0
    publisher.publish_bytes("t", b"garbage")
    publisher.publish("t", trajectory(2), headers={"h": "v"})
    source: EventSource = InMemoryConsumer(publisher, ["t"])
    events = source.consume()
    assert [e.value.trajectory_id for e in events] == ["traj-1", "traj-2"]
    assert events[0].key == "g" and events[1].headers == {"h": b"v"}
    source.commit(events[0])
    assert (
        isinstance(source, InMemoryConsumer) and source.committed["t"] == 1 and source.num_dead_letters == 1
    )


def test_event_consumer_fetches_again_soon_after_a_full_queue() -> None:
    from stacx.consumers import EventConsumer

    config = EventConsumer.Config(topics=["t"])
    assert EventConsumer._librdkafka_config(config)["fetch.queue.backoff.ms"] == 10
    tuned = EventConsumer.Config(topics=["t"], fetch_queue_backoff_ms=50)
    assert EventConsumer._librdkafka_config(tuned)["fetch.queue.backoff.ms"] == 50
    with pytest.raises(ValueError, match="fetch_queue_backoff_ms"):
        EventConsumer.Config(topics=["t"], fetch_queue_backoff_ms=-1)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_finite_check_is_exact_where_a_float32_sum_overflows() -> None:
    big = trajectory(1, token_ids=token_ids([1, 2]), loss_mask=loss_mask([1, 1]),
                     logprobs=logprobs([-3e38, -3e38]))  # fmt: skip
    assert np.isinf(np.add.reduce(big.logprobs))  # the fast check alone would call it non-finite
    assert record_problems(big) == []


def test_a_field_of_the_wrong_type_is_checked_like_before() -> None:
    """The fast path raises TypeError on None; the full check skips a None reward, as it did."""
    assert record_problems(trajectory(1, reward=None)) == []  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_every_non_finite_entry_is_found_in_float_arrays(dtype: Any, bad: float) -> None:
    from stacx.schemas.validation import _non_finite

    largest = np.finfo(dtype).max
    for values in (np.full(50, largest, dtype), np.full((5, 10), -largest, dtype)):  # sums overflow
        assert _non_finite("x", values) == []
        values.flat[37] = bad
        assert _non_finite("x", values) == [f"x must be finite, got [37]={values.flat[37]}"]
    assert _non_finite("x", np.zeros(0, dtype)) == [] and _non_finite("x", np.arange(3)) == []
    assert _non_finite("x", [1.0, bad]) == [f"x must be finite, got [1]={bad}"]
    assert _non_finite("x", bad) == [f"x must be finite, got [0]={bad}"] and _non_finite("x", 2) == []
