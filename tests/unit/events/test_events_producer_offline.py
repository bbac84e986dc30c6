"""EventProducer without a broker: failures surface in futures, a full queue applies backpressure."""

from __future__ import annotations

import logging
from concurrent.futures import wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest
from events_strategies import trajectory

from producers import DeliveryError, EventProducer, ProducerClosedError
from producers.blobs import FsspecBlobStore
from producers.event_producer import Delivery, _connection_options
from schemas.claimcheck import ClaimCheck
from schemas.errors import RecordValidationError

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
    with caplog.at_level(logging.ERROR, logger="producers.event_producer"):
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
    with caplog.at_level(logging.WARNING, logger="producers.event_producer"):
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
    with caplog.at_level(logging.DEBUG, logger="producers.event_producer"):
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
        with caplog.at_level(logging.INFO, logger="producers.event_producer"):
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
