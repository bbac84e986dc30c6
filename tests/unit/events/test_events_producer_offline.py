"""EventProducer without a broker: failures surface in futures, a full queue applies backpressure."""

from __future__ import annotations

import logging
from concurrent.futures import wait

import pytest
from events_strategies import trajectory

from producers import DeliveryError, EventProducer, ProducerClosedError
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
