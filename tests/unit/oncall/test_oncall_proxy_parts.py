"""The proxy's recorder (bounded, never blocking, degraded mode) and session router (pinning)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from stacx.producers import InMemoryPublisher
from stacx.producers.errors import DeliveryError
from stacx.rollout.proxy import EventRecorder, ProxyConfigError, SessionRouter
from stacx.rollout.proxy.recorder import is_permanent
from stacx.schemas.errors import RecordValidationError
from stacx.schemas.records import DeadLetter, Feedback


class StuckPublisher:
    """A broker that never acknowledges (Kafka down): futures stay pending until `release`."""

    def __init__(self) -> None:
        self.futures: list[Future[Any]] = []
        self.records: list[object] = []

    def publish(self, topic: str, record: object, **_: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.futures.append(future)
        self.records.append(record)
        return future

    def fail_all(self) -> None:
        # A snapshot: failing a future makes the recorder publish its retry at once, from another
        # thread; iterating the live list would fail those retries too (a race, not a behaviour).
        for f in list(self.futures):
            if not f.done():
                f.set_exception(RuntimeError("broker down"))

    def ack_all(self) -> None:
        for f in list(self.futures):
            if not f.done():
                f.set_result(None)

    def flush(self, timeout_s: float | None = None) -> int:
        return 0

    def close(self, timeout_s: float | None = None) -> None:
        pass


def _fb(i: int) -> Feedback:
    return Feedback(session_id=f"s{i}", reward=1.0)


def test_full_buffer_drops_new_events_without_blocking_and_reports_degraded() -> None:
    publisher = StuckPublisher()
    recorder = EventRecorder(EventRecorder.Config(max_buffered=4, retry_backoff_s=0.0), publisher)
    accepted = [recorder.record("t", _fb(i)) for i in range(6)]
    assert accepted == [True] * 4 + [False] * 2
    metrics = recorder.metrics.snapshot()
    assert metrics["events_dropped_total"] == 2 and metrics["degraded"] == 1
    assert recorder.degraded and recorder.num_buffered == 4
    _wait(lambda: len(publisher.futures) == 4)
    publisher.ack_all()
    assert recorder.flush(5.0)
    assert not recorder.degraded and recorder.metrics.snapshot()["events_published_total"] == 4
    recorder.close(1.0)


def test_failed_deliveries_are_retried_in_arrival_order_until_acknowledged() -> None:
    publisher = StuckPublisher()
    recorder = EventRecorder(EventRecorder.Config(max_buffered=10, retry_backoff_s=0.0), publisher)
    for i in range(3):
        recorder.record("t", _fb(i))
    _wait(lambda: len(publisher.futures) == 3)
    publisher.fail_all()
    _wait(lambda: len(publisher.futures) == 6)
    assert [r.session_id for r in publisher.records[3:]] == ["s0", "s1", "s2"]  # type: ignore[attr-defined]
    publisher.ack_all()
    assert recorder.flush(5.0)
    assert recorder.metrics.snapshot()["delivery_failures_total"] == 3
    recorder.close(1.0)


def test_a_publisher_that_raises_is_retried_too() -> None:
    class Raising(InMemoryPublisher):
        calls = 0

        def publish(self, topic: str, record: object, **kw: Any) -> Future[Any]:
            Raising.calls += 1
            if Raising.calls == 1:
                raise RuntimeError("schema catalogue unreachable")
            return super().publish(topic, record, **kw)

    publisher = Raising()
    recorder = EventRecorder(EventRecorder.Config(retry_backoff_s=0.0), publisher)
    recorder.record("t", _fb(0))
    assert recorder.flush(5.0) and len(publisher.records("t")) == 1
    recorder.close(1.0)


def test_recorder_config_is_validated() -> None:
    with pytest.raises(ProxyConfigError, match="max_buffered"):
        EventRecorder.Config(max_buffered=0)


def test_sessions_stay_pinned_and_new_ones_spread() -> None:
    router = SessionRouter(["http://a", "http://b"])
    first, second = router.pick("s1"), router.pick("s2")
    assert {first, second} == {"http://a", "http://b"}
    assert all(router.pick("s1") == first for _ in range(5))
    with router.in_flight("http://a"), router.in_flight("http://a"):
        assert router.pick("s3") == "http://b"  # least busy
    assert router.repin("s1", first) != first and router.num_repinned == 1


def test_pins_are_bounded_and_a_single_server_is_never_repinned() -> None:
    router = SessionRouter(["http://a"], max_sessions=2)
    for s in ("s1", "s2", "s3"):
        router.pick(s)
    assert router.num_pinned == 2 and router.repin("s3", "http://a") is None
    with pytest.raises(ProxyConfigError, match="upstreams"):
        SessionRouter([])


def _wait(condition: Any, timeout_s: float = 60.0) -> None:
    """Wait for the recorder's thread (a deadline, not a speed limit: shared machines are slow)."""
    done = threading.Event()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"condition not reached in {timeout_s:.0f} s")


def test_a_poison_event_is_dead_lettered_and_the_events_behind_it_flow() -> None:
    """One NaN reward (refused by the publisher's validation, as EventProducer refuses it) must not
    hold back the good events queued after it: it goes to the DLQ with the reason."""
    publisher = InMemoryPublisher()
    recorder = EventRecorder(EventRecorder.Config(retry_backoff_s=0.0), publisher)
    recorder.record("fb", Feedback(session_id="bad", reward=float("nan")))
    for i in range(3):
        recorder.record("fb", _fb(i))
    assert recorder.flush(5.0)
    assert [r.session_id for r in publisher.records("fb")] == ["s0", "s1", "s2"]  # type: ignore[attr-defined]
    [letter] = publisher.records("stacx.dlq")
    assert isinstance(letter, DeadLetter) and letter.source_topic == "fb" and letter.key == b"bad"
    assert "reward" in letter.reason and letter.error_type == "RecordValidationError"
    assert recorder.metrics.snapshot()["events_dead_lettered_total"] == 1
    assert recorder.problem() is None
    recorder.close(1.0)


def test_a_retrying_event_makes_the_recorder_report_a_problem_until_delivered() -> None:
    publisher = StuckPublisher()
    recorder = EventRecorder(EventRecorder.Config(retry_backoff_s=30.0), publisher)
    recorder.record("t", _fb(0))
    _wait(lambda: len(publisher.futures) == 1)
    assert recorder.problem() is None
    publisher.fail_all()
    _wait(lambda: recorder.problem() is not None)
    assert "1 events waiting for a retry" in str(recorder.problem())
    recorder.close(0.1)


@pytest.mark.parametrize(
    ("exc", "permanent"),
    [
        (RecordValidationError("Feedback", ["reward is nan"]), True),
        (ValueError("cannot encode"), True),
        (DeliveryError("t", "r", "Local: Message timed out"), False),
        (RuntimeError("schema catalogue unreachable"), False),
    ],
)
def test_only_failures_of_the_record_itself_are_permanent(exc: Exception, permanent: bool) -> None:
    assert is_permanent(exc) is permanent
