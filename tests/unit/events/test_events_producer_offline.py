"""EventProducer without a broker: failures surface in futures, a full queue applies backpressure."""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest
from events_strategies import trajectory
from opentelemetry import trace
from tracing_fixtures import in_memory_tracing

from stacx.producers import DeliveryError, EventProducer, ProducerClosedError, event_producer
from stacx.producers.blobs import FsspecBlobStore
from stacx.producers.event_producer import Delivery, _connection_options, registry_client
from stacx.producers.tracing import TRACEPARENT
from stacx.schemas.catalogue import SchemaCatalogue
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import Codec
from stacx.schemas.errors import RecordValidationError
from stacx.schemas.identity import record_key
from stacx.schemas.records import Trajectory

DEAD_BROKER = "127.0.0.1:1"


def offline_producer(**overrides: object) -> EventProducer:
    settings: dict[str, object] = {
        "bootstrap_servers": DEAD_BROKER,
        "register_schemas": False,
        "claim_check_threshold_bytes": 1_000_000,
        "delivery_timeout_ms": 1000,
        "linger_ms": 0,
    }
    config = EventProducer.Config(**(settings | overrides))  # type: ignore[arg-type]
    return EventProducer(config)


def test_delivery_failure_reaches_the_future_and_the_log(caplog: pytest.LogCaptureFixture) -> None:
    producer = offline_producer()
    with caplog.at_level(logging.ERROR, logger="stacx.producers.event_producer"):
        future = producer.publish("test.offline", trajectory(1))
        error = future.exception(timeout=30)
    producer.close(timeout_s=5)
    assert isinstance(error, DeliveryError)
    assert error.record_id == "traj-1" and error.topic == "test.offline"
    assert any("traj-1" in r.getMessage() for r in caplog.records)


def test_full_queue_blocks_instead_of_raising() -> None:
    producer = offline_producer(queue_max_messages=5)
    futures = [producer.publish("test.offline", trajectory(i)) for i in range(15)]
    done, pending = wait(futures, timeout=60)
    producer.close(timeout_s=5)
    assert not pending
    assert all(isinstance(f.exception(), DeliveryError) for f in futures)


def test_publish_after_close_raises() -> None:
    producer = offline_producer()
    producer.close(timeout_s=1)
    with pytest.raises(ProducerClosedError):
        producer.publish("test.offline", trajectory(0))


@pytest.mark.parametrize("field,value", [("compression", "brotli"), ("max_message_bytes", 10)])
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        EventProducer.Config(**{field: value})  # type: ignore[arg-type]


def test_close_fails_the_futures_of_undelivered_records() -> None:
    producer = offline_producer(delivery_timeout_ms=600_000)
    future = producer.publish("test.offline", trajectory(4))
    producer.close(timeout_s=0.5)
    error = future.exception(timeout=10)
    assert isinstance(error, DeliveryError) and error.record_id == "traj-4"


class _Entry:
    def __init__(self, value: int) -> None:
        self.value = str(value)


class _Done:
    def __init__(self, value: object = None, error: Exception | None = None) -> None:
        self.value, self.error = value, error

    def result(self, timeout: float | None = None) -> object:
        if self.error is not None:
            raise self.error
        return self.value


class _Admin:
    """Answers like a broker whose topic `missing` does not exist yet (message.max.bytes 64 MiB)."""

    def __init__(self) -> None:
        self.topics: dict[str, int] = {}
        self.asked: list[str] = []

    def describe_configs(self, resources: list[object]) -> dict[object, _Done]:
        (resource,) = resources
        name = str(resource.name)  # type: ignore[attr-defined]
        self.asked.append(name)
        if "BROKER" in str(resource.restype).upper():  # type: ignore[attr-defined]
            return {resource: _Done({"message.max.bytes": _Entry(64 << 20)})}
        if name not in self.topics:
            return {resource: _Done(error=RuntimeError("UNKNOWN_TOPIC_OR_PART"))}
        return {resource: _Done({"max.message.bytes": _Entry(self.topics[name])})}

    def list_topics(self, timeout: float) -> object:
        return type("Meta", (), {"brokers": {1: object()}})()


def test_limit_of_a_topic_not_created_yet_is_the_brokers_and_asked_again_later() -> None:
    producer = offline_producer(claim_check_threshold_bytes=None, max_message_bytes=32 << 20)
    admin = producer._admin = _Admin()
    now = [0.0]
    producer._clock = lambda: now[0]
    try:
        # the old producer assumed 1 MB here and claim-checked every record above it
        assert producer._limit_for("missing") == (32 << 20) - 4096
        admin.topics["missing"] = 2 << 20  # created with its own limit
        now[0] = 61.0
        assert "missing" in producer._guessed and now[0] >= producer._guessed["missing"]
        assert producer._limit_for("missing") == (2 << 20) - 4096
        assert "missing" not in producer._guessed  # known now: cached for good
    finally:
        producer.close(timeout_s=1)


def test_a_nan_reward_is_refused_with_the_field_named() -> None:
    producer = offline_producer()
    with pytest.raises(RecordValidationError, match=r"reward must be finite, got \[0\]=nan"):
        producer.publish("test.offline", trajectory(1, reward=float("nan")))
    assert producer.flush(timeout_s=1) == 0  # nothing was queued
    producer.close(timeout_s=1)


class _CapturingProducer:
    """Stands in for confluent_kafka.Producer: keeps what is produced and acknowledges it."""

    def __init__(self, config: dict[str, object]) -> None:
        self.produced: list[tuple[str, bytes, object, object]] = []

    def produce(self, topic: str, value: bytes, key: object = None, *, headers: object = None,
                on_delivery: Any = None) -> None:  # fmt: skip
        self.produced.append((topic, value, key, headers))
        msg = SimpleNamespace(topic=lambda: topic, partition=lambda: 2, offset=lambda: 41,
                              timestamp=lambda: (1, 1234))  # fmt: skip
        on_delivery(None, msg)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        return 0

    def purge(self) -> None:
        pass


def _captured(monkeypatch: pytest.MonkeyPatch, **overrides: object) -> EventProducer:
    monkeypatch.setattr(confluent_kafka, "Producer", _CapturingProducer)
    return offline_producer(**overrides)


def test_a_record_over_the_limit_goes_by_claim_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    producer = _captured(monkeypatch, claim_check_threshold_bytes=16, blob_store_url=str(tmp_path))
    record = trajectory(3)
    delivery = producer.publish("test.claims", record).result(timeout=5)
    producer.close(timeout_s=1)
    assert delivery == Delivery("test.claims", 2, 41, 1234, "traj-3")
    ((topic, value, _, _),) = producer._producer.produced
    claim = producer.codec.decode(value)
    assert isinstance(claim, ClaimCheck) and topic == "test.claims"
    full = producer.codec.encode(record)
    assert claim.size_bytes == len(full) and claim.record_id == "traj-3"
    assert claim.record_type == "stacx.Trajectory"
    assert claim.uri.startswith(tmp_path.as_uri() + "/test.claims/")  # the topic is the prefix
    assert FsspecBlobStore.get(claim.uri, sha256=claim.sha256) == full


@pytest.mark.parametrize(
    "bootstrap,warns",
    [
        ("127.0.0.1:9092,localhost:9093", False),
        ("[::1]:9092", False),
        ("::1:9092", False),
        ("localhost:9092,kafka-1:9092", True),
    ],
)
def test_local_claim_check_blobs_with_a_remote_broker_warn(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    bootstrap: str,
    warns: bool,
) -> None:
    producer = _captured(monkeypatch, claim_check_threshold_bytes=16, blob_store_url=str(tmp_path),
                         bootstrap_servers=bootstrap)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="stacx.producers.event_producer"):
        producer.publish("test.claims", trajectory(1)).result(timeout=5)
    producer.close(timeout_s=1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not warns:
        assert warnings == []
        return
    (message,) = warnings
    assert str(tmp_path) in message and bootstrap in message and "STACX_BLOBS" in message


def test_publish_bytes_sends_the_value_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = _captured(monkeypatch, claim_check_threshold_bytes=8, trace_context=False)
    delivery = producer.publish_bytes("t", b"0123456789abcdef", key=b"k", record_id="r1").result(timeout=5)
    assert delivery.record_id == "r1" and delivery.offset == 41
    ((topic, value, key, _),) = producer._producer.produced
    assert (topic, value, key) == ("t", b"0123456789abcdef", b"k")  # no codec, no claim check
    producer.close(timeout_s=1)
    with pytest.raises(ProducerClosedError, match="publish_bytes"):
        producer.publish_bytes("t", b"x")


async def test_publish_async_resolves_with_the_acknowledgement(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = _captured(monkeypatch)
    delivery = await producer.publish_async("t", trajectory(5), key="k5", headers={"x-run": "a"})
    producer.close(timeout_s=1)
    assert delivery.record_id == "traj-5"
    ((topic, _, key, headers),) = producer._producer.produced
    assert topic == "t" and key == "k5" and ("x-run", b"a") in headers


def test_only_security_options_reach_the_other_clients() -> None:
    options = {"security.protocol": "SSL", "sasl.mechanism": "PLAIN", "ssl.ca.location": "/ca",
               "linger.ms": 5}  # fmt: skip
    assert _connection_options(options) == {
        "security.protocol": "SSL",
        "sasl.mechanism": "PLAIN",
        "ssl.ca.location": "/ca",
    }


def test_the_local_blob_warning_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    producer = _captured(monkeypatch, claim_check_threshold_bytes=16, blob_store_url=str(tmp_path),
                         bootstrap_servers="kafka-1:9092")  # fmt: skip
    with caplog.at_level(logging.DEBUG, logger="stacx.producers.event_producer"):
        producer.publish("test.claims", trajectory(1)).result(timeout=5)
    producer.close(timeout_s=1)
    messages = [r.getMessage() for r in caplog.records]
    root = producer._blobs.root_url if producer._blobs else ""
    assert (
        f"claim-check blobs go to {root}, a folder only this machine can read, while Kafka is at "
        "kafka-1:9092: set STACX_BLOBS (e.g. s3://bucket/stacx-blobs) on every machine"
    ) in messages
    size = len(producer.codec.encode(trajectory(1)))
    stored = [m for m in messages if m.startswith("record traj-1 ")]
    assert len(stored) == 1 and stored[0].startswith(
        f"record traj-1 ({size} bytes) to test.claims stored by claim check at "
        f"{tmp_path.as_uri()}/test.claims/"
    )


class _NoBroker(_Admin):
    """A cluster that answers no config question."""

    def describe_configs(self, resources: list[object]) -> dict[object, _Done]:
        (resource,) = resources
        return {resource: _Done(error=RuntimeError("timed out"))}


def test_unknown_limits_are_logged_with_what_is_assumed(caplog: pytest.LogCaptureFixture) -> None:
    producer = offline_producer(claim_check_threshold_bytes=None)
    producer._admin = _NoBroker()
    try:
        with caplog.at_level(logging.INFO, logger="stacx.producers.event_producer"):
            assert producer._topic_max_bytes("t.x") == 1048588  # Kafka's default message.max.bytes
    finally:
        producer.close(timeout_s=1)
    assert [r.getMessage() for r in caplog.records] == [
        "broker message.max.bytes unknown (timed out); assuming Kafka's default",
        "max.message.bytes of t.x unknown (timed out); using the broker's 1048588 for now",
    ]


def test_a_guessed_limit_is_not_asked_again_before_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = _captured(monkeypatch, claim_check_threshold_bytes=None)
    admin = producer._admin = _Admin()
    now = [100.0]
    producer._clock = lambda: now[0]
    producer.publish("missing", trajectory(1)).result(timeout=5)
    asked = list(admin.asked)
    now[0] = 159.0  # 59 s later: the guess still holds
    producer.publish("missing", trajectory(2)).result(timeout=5)
    assert admin.asked == asked
    now[0] = 160.0
    producer.publish("missing", trajectory(3)).result(timeout=5)
    assert len(admin.asked) > len(asked)
    producer.close(timeout_s=1)


def test_the_admin_client_is_built_once_for_the_configured_cluster() -> None:
    from confluent_kafka.admin import AdminClient

    producer = offline_producer(kafka={"security.protocol": "PLAINTEXT"})
    try:
        admin = producer._admin_client()
        assert isinstance(admin, AdminClient) and producer._admin_client() is admin
    finally:
        producer.close(timeout_s=1)


def test_publish_bytes_passes_headers_and_an_empty_default_id(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = _captured(monkeypatch, trace_context=False)
    delivery = producer.publish_bytes("t", b"v", headers={"x-run": "a"}).result(timeout=5)
    ((topic, _, _, headers),) = producer._producer.produced
    assert delivery.record_id == "" and topic == "t" and ("x-run", b"a") in headers
    producer.close(timeout_s=1)
    with pytest.raises(ProducerClosedError, match=r"^publish_bytes\(\) on a closed EventProducer$"):
        producer.publish_bytes("t", b"x")


class _ScriptedProducer(_CapturingProducer):
    """A `_CapturingProducer` that also records every poll / flush / purge / close, can refuse the
    first produce calls (BufferError, then KafkaException) and can report a delivery error."""

    def __init__(self, config: dict[str, object]) -> None:
        super().__init__(config)
        self.produced: list[tuple[str, bytes, Any, Any]] = []  # headers: a list of pairs, or None
        self.calls: list[tuple[str, object, str]] = []  # (method, argument, thread name)
        self.refusals: list[Exception] = []
        self.delivery_error: object = None
        self.unflushed = 0
        self.closed = False

    def _note(self, method: str, argument: object) -> None:
        self.calls.append((method, argument, threading.current_thread().name))

    def produce(self, topic: str, value: bytes, key: object = None, *, headers: object = None,
                on_delivery: Any = None) -> None:  # fmt: skip
        if self.refusals:
            raise self.refusals.pop(0)
        if self.delivery_error is None:
            super().produce(topic, value, key, headers=headers, on_delivery=on_delivery)
            return
        self.produced.append((topic, value, key, headers))
        on_delivery(self.delivery_error, SimpleNamespace(topic=lambda: topic))

    def poll(self, timeout: float = 0) -> int:
        self._note("poll", timeout)
        return 0

    def flush(self, timeout: float = -1) -> int:
        self._note("flush", timeout)
        remaining, self.unflushed = self.unflushed, 0
        return remaining

    def purge(self) -> None:
        self._note("purge", None)

    def close(self) -> None:
        self.closed = True


def _scripted(
    monkeypatch: pytest.MonkeyPatch, **overrides: object
) -> tuple[EventProducer, _ScriptedProducer]:
    monkeypatch.setattr(confluent_kafka, "Producer", _ScriptedProducer)
    producer = offline_producer(**overrides)
    assert isinstance(producer._producer, _ScriptedProducer)
    return producer, producer._producer


def test_delivery_reports_are_served_by_a_named_daemon_thread_until_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, client = _scripted(monkeypatch, poll_interval_s=0.01)
    (poller,) = [
        t for t in threading.enumerate() if t.name == "stacx-producer-poll" and t is producer._poller
    ]
    assert poller.daemon  # a forgotten close() never keeps the interpreter alive
    producer.close(timeout_s=1)
    assert not poller.is_alive()
    polls = [(arg, thread) for method, arg, thread in client.calls if method == "poll"]
    assert polls[-1] == (0, "stacx-producer-poll")  # the last reports are served without waiting
    assert all(arg == 0.01 for arg, _ in polls[:-1])


def test_flush_without_a_timeout_waits_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    producer, client = _scripted(monkeypatch)
    assert producer.flush() == 0
    assert producer.flush(2.5) == 0
    flushes = [arg for method, arg, _ in client.calls if method == "flush"]
    assert flushes == [-1, 2.5]  # librdkafka: -1 is "no limit"; any other negative is already past
    producer.close(timeout_s=1)


def test_close_with_undelivered_records_says_so_purges_and_frees_the_client(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    producer, client = _scripted(monkeypatch)
    client.unflushed = 3
    with caplog.at_level(logging.ERROR, logger="stacx.producers.event_producer"):
        producer.close(timeout_s=0.5)
    assert [r.getMessage() for r in caplog.records] == [
        "EventProducer closing with 3 records undelivered: failing them"
    ]
    caller = [(m, a) for m, a, thread in client.calls if thread != "stacx-producer-poll"]
    assert caller == [("flush", 0.5), ("purge", None), ("flush", 5.0)]
    assert client.closed


def test_close_with_everything_delivered_logs_nothing_and_frees_the_client(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    producer, client = _scripted(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="stacx.producers.event_producer"):
        producer.close(timeout_s=0.5)
    assert caplog.records == [] and client.closed
    assert [m for m, _, thread in client.calls if thread != "stacx-producer-poll"] == ["flush"]


def test_publish_after_close_says_which_call_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    producer, _ = _scripted(monkeypatch)
    producer.close(timeout_s=1)
    with pytest.raises(ProducerClosedError, match=r"^publish\(\) on a closed EventProducer$"):
        producer.publish("t", trajectory(0))


def test_a_record_exactly_at_the_limit_goes_inline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    record = trajectory(7)
    size = len(Codec().encode(record))
    producer, client = _scripted(monkeypatch, claim_check_threshold_bytes=size, blob_store_url=str(tmp_path))
    producer.publish("t", record).result(timeout=5)
    producer.close(timeout_s=1)
    ((_, value, key, _),) = client.produced
    assert value == producer.codec.encode(record) and producer._blobs is None  # no claim check
    assert key == record_key(record) and key is not None  # the record's own key by default


def test_a_full_queue_serves_reports_briefly_then_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    producer, client = _scripted(monkeypatch, trace_context=False)
    client.refusals = [BufferError("queue full"), BufferError("queue full")]
    delivery = producer.publish_bytes("t", b"v", record_id="r9").result(timeout=5)
    producer.close(timeout_s=1)
    assert delivery.record_id == "r9" and len(client.produced) == 1
    waits = [a for m, a, thread in client.calls if m == "poll" and thread != "stacx-producer-poll"]
    assert waits == [0.05, 0.05]  # a short wait for room, not the poller's period


@pytest.mark.parametrize("rid,shown", [("r1", "r1"), ("", "(no id)")])
def test_a_record_the_client_refuses_fails_its_future_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, rid: str, shown: str
) -> None:
    producer, client = _scripted(monkeypatch)
    client.refusals = [confluent_kafka.KafkaException("Message size too large")]
    with caplog.at_level(logging.ERROR, logger="stacx.producers.event_producer"):
        error = producer.publish_bytes("t.big", b"v", record_id=rid).exception(timeout=5)
    producer.close(timeout_s=1)
    assert [r.getMessage() for r in caplog.records] == [
        f"record {shown} to t.big rejected: Message size too large"
    ]
    assert isinstance(error, DeliveryError)
    assert (error.topic, error.record_id, error.reason) == ("t.big", rid, "Message size too large")
    assert str(error) == f"record {shown} to 't.big' not delivered: Message size too large"


class _KafkaError:
    def __init__(self, text: str, retriable: bool) -> None:
        self.text, self._retriable = text, retriable

    def retriable(self) -> bool:
        return self._retriable

    def __str__(self) -> str:
        return self.text


@pytest.mark.parametrize("rid,shown,retriable", [("r2", "r2", True), ("", "(no id)", False)])
def test_a_failed_delivery_report_fails_the_future_with_the_brokers_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, rid: str, shown: str, retriable: bool
) -> None:
    producer, client = _scripted(monkeypatch)
    client.delivery_error = _KafkaError("Broker: Not enough in-sync replicas", retriable)
    with caplog.at_level(logging.ERROR, logger="stacx.producers.event_producer"):
        error = producer.publish_bytes("t.acks", b"v", record_id=rid).exception(timeout=5)
    producer.close(timeout_s=1)
    assert [r.getMessage() for r in caplog.records] == [
        f"record {shown} to t.acks not delivered: Broker: Not enough in-sync replicas"
    ]
    assert isinstance(error, DeliveryError) and error.retriable is retriable
    assert (error.topic, error.record_id) == ("t.acks", rid)
    assert error.reason == "Broker: Not enough in-sync replicas"


def test_each_publish_is_a_producer_span_named_after_the_topic_with_the_record_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer, client = _scripted(monkeypatch)
    with in_memory_tracing() as spans:
        producer.publish("t.traced", trajectory(6)).result(timeout=5)
    producer.close(timeout_s=1)
    (published,) = spans.get_finished_spans()
    assert published.name == "publish t.traced" and published.kind is trace.SpanKind.PRODUCER
    assert published.attributes is not None
    assert published.attributes["messaging.destination.name"] == "t.traced"
    assert published.attributes["stacx.record_id"] == "traj-6"
    ((_, value, _, headers),) = client.produced
    names = [k for k, _ in headers]
    # the trace context of that span, then what the value is (content type, writer schema)
    assert names == ["traceparent", "content-type", "stacx-schema-fingerprint"]
    assert dict(headers)["content-type"] == b"avro/binary; framing=single-object"
    assert producer.codec.content_headers(value) == [(k, v) for k, v in headers if k != "traceparent"]


def test_the_callers_headers_keep_their_trace_and_content_type(monkeypatch: pytest.MonkeyPatch) -> None:
    original = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    producer, client = _scripted(monkeypatch)
    value = producer.codec.encode(trajectory(1))
    with in_memory_tracing():
        producer.publish_bytes("t", value, headers={"x-run": "a"}).result(timeout=5)
        given = {TRACEPARENT: original, "content-type": "mine"}
        producer.publish_bytes("t", value, headers=given).result(timeout=5)
    producer.close(timeout_s=1)
    (_, _, _, first), (_, _, _, second) = client.produced
    assert [k for k, _ in first] == ["traceparent", "content-type", "stacx-schema-fingerprint", "x-run"]
    assert dict(first)["traceparent"] != original.encode()
    fingerprint = dict(first)["stacx-schema-fingerprint"]
    assert second == [
        ("stacx-schema-fingerprint", fingerprint),
        (TRACEPARENT, original.encode()),
        ("content-type", b"mine"),
    ]


def test_no_trace_context_when_the_config_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    producer, client = _scripted(monkeypatch, trace_context=False)
    with in_memory_tracing():
        producer.publish_bytes("t", b"opaque", headers={"x-run": "a"}).result(timeout=5)
        producer.publish_bytes("t", b"opaque").result(timeout=5)
    producer.close(timeout_s=1)
    (_, _, _, first), (_, _, _, second) = client.produced
    assert first == [("x-run", b"a")] and second is None


class _TimedAdmin(_Admin):
    """`_Admin` whose broker is id 7 and that records the timeouts of each question."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[tuple[str, float | None]] = []

    def describe_configs(self, resources: list[object]) -> dict[object, _Done]:
        (resource,) = resources
        return {resource: _TimedRecorder(self, super().describe_configs(resources)[resource])}

    def list_topics(self, timeout: float) -> object:
        self.timeouts.append(("list_topics", timeout))
        return type("Meta", (), {"brokers": {7: object()}})()


class _TimedRecorder(_Done):
    def __init__(self, admin: _TimedAdmin, done: _Done) -> None:
        super().__init__(done.value, done.error)
        self.admin = admin

    def result(self, timeout: float | None = None) -> object:
        self.admin.timeouts.append(("result", timeout))
        return super().result(timeout)


def test_a_known_topics_limit_is_its_own_and_cached_for_good() -> None:
    producer = offline_producer(claim_check_threshold_bytes=None, max_message_bytes=32 << 20)
    admin = producer._admin = _TimedAdmin()
    admin.topics["known"] = 2 << 20
    try:
        assert producer._limit_for("known") == (2 << 20) - 4096
        assert "known" not in producer._guessed and producer._limits["known"] == (2 << 20) - 4096
        assert admin.asked == ["known"]
        assert admin.timeouts == [("result", 10)]  # a bounded wait
    finally:
        producer.close(timeout_s=1)


def test_the_limit_of_a_missing_topic_is_asked_of_the_first_broker_with_bounded_waits() -> None:
    producer = offline_producer(claim_check_threshold_bytes=None, max_message_bytes=128 << 20)
    admin = producer._admin = _TimedAdmin()
    try:
        assert producer._limit_for("missing") == (64 << 20) - 4096  # the broker's message.max.bytes
        assert admin.asked == ["missing", "7"]  # the topic, then broker 7 by its id
        assert admin.timeouts == [("result", 10), ("list_topics", 10), ("result", 10)]  # bounded waits
    finally:
        producer.close(timeout_s=1)


def test_a_schema_registry_url_gives_confluent_framed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"mock://unit-{uuid.uuid4().hex[:8]}"
    producer, client = _scripted(monkeypatch, schema_registry_url=url)
    record = trajectory(2)
    producer.publish("t.registry", record).result(timeout=5)
    producer.close(timeout_s=1)
    ((_, value, _, headers),) = client.produced
    assert value[:1] == b"\x00"  # Confluent wire format: magic byte, schema id, Avro body
    assert dict(headers)["content-type"] != b"avro/binary; framing=single-object"
    decoded = Codec(registry=registry_client(url)).decode(value)
    assert isinstance(decoded, Trajectory) and decoded.trajectory_id == "traj-2"


class _RecordingCatalogue:
    """Stands in for SchemaCatalogue: keeps its config, the schemas registered and whether closed."""

    Config = SchemaCatalogue.Config
    built: list[_RecordingCatalogue] = []

    def __init__(self, config: SchemaCatalogue.Config) -> None:
        self.config = config
        self.registered: list[str] = []
        self.closed = False
        type(self).built.append(self)

    def register(self, info: Any) -> None:
        self.registered.append(info.name)

    def close(self) -> None:
        self.closed = True


def test_schemas_are_registered_in_the_configured_catalogue_before_their_first_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_RecordingCatalogue, "built", [])
    monkeypatch.setattr(event_producer, "SchemaCatalogue", _RecordingCatalogue)
    producer, client = _scripted(monkeypatch, register_schemas=True, schemas_topic="unit.schemas",
                                 bootstrap_servers="127.0.0.1:2")  # fmt: skip
    producer.publish("t", trajectory(1)).result(timeout=5)
    producer.publish("t", trajectory(2)).result(timeout=5)
    producer.close(timeout_s=1)
    (catalogue,) = _RecordingCatalogue.built
    assert catalogue.config.bootstrap_servers == "127.0.0.1:2" and catalogue.config.topic == "unit.schemas"
    assert catalogue.registered == ["stacx.Trajectory"]  # once, before the first event
    assert catalogue.closed and len(client.produced) == 2


def test_a_delivery_report_for_a_cancelled_future_is_dropped_quietly() -> None:
    """A stopping command cancels what it waited for; the broker's late answer must not raise
    InvalidStateError in the poll thread (two tracebacks at every stop while Kafka was gone)."""
    from concurrent.futures import Future

    from stacx.producers.event_producer import _on_delivery

    message = SimpleNamespace(
        topic=lambda: "t", partition=lambda: 0, offset=lambda: 1, timestamp=lambda: (1, 5)
    )
    for err in (confluent_kafka.KafkaError(confluent_kafka.KafkaError._MSG_TIMED_OUT), None):
        future: Future[Delivery] = Future()
        future.cancel()
        _on_delivery(future, "rid", err, message)
        assert future.cancelled()


def test_a_rollout_publisher_stops_in_bounded_time_while_kafka_is_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`stacx rollout` stopped with the broker gone waited 81 s (the delivery timeout) on close."""
    import asyncio
    import time

    from stacx.rollout import adapters

    monkeypatch.setattr(adapters, "CLOSE_TIMEOUT_S", 0.5)
    publisher = adapters.KafkaTrajectoryPublisher(offline_producer(delivery_timeout_ms=600_000), topic="t")

    async def publish_then_stop() -> None:
        waiter = asyncio.ensure_future(publisher.publish(trajectory(5)))
        await asyncio.sleep(0.1)
        waiter.cancel()  # what a SIGTERM does to the episode waiting for its acknowledgement
        await publisher.close()

    started = time.monotonic()
    asyncio.run(publish_then_stop())
    assert time.monotonic() - started < 10
