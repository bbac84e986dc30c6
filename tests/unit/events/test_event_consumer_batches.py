"""EventConsumer.consume over a fake librdkafka consumer: chunked reads, the same events and
limits as one big read, and the cyclic garbage collector paused only while a batch is built
(not while waiting for the broker)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Message
from events_strategies import trajectory

from stacx.consumers import EventConsumer
from stacx.consumers.event_consumer import _CollectorPause
from stacx.schemas.codec import encode


class _FakeKafka:
    """Stands in for confluent_kafka.Consumer: hands out queued messages (at most `per_call` a
    call: the rest "arrives later"), records each call and whether the collector ran."""

    def __init__(self, messages: list[Any], per_call: int | None = None) -> None:
        self.queue = list(messages)
        self.per_call = per_call
        self.calls: list[tuple[int, float, bool]] = []

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.calls.append((num_messages, timeout, gc.isenabled()))
        taken = min(num_messages, self.per_call or num_messages)
        batch, self.queue = self.queue[:taken], self.queue[taken:]
        return batch

    def close(self) -> None:
        pass


def _messages(count: int, *, bad_at: int | None = None) -> list[Any]:
    return [
        Message(topic="t", partition=0, offset=i, key=b"k", timestamp=(1, 1000 + i),
                value=b"not an event" if i == bad_at else encode(trajectory(i)))
        for i in range(count)
    ]  # fmt: skip


@pytest.fixture
def make_consumer() -> Iterator[Any]:
    made: list[EventConsumer] = []

    def make(
        messages: list[Any], per_call: int | None = None, **config: Any
    ) -> tuple[EventConsumer, _FakeKafka]:
        consumer = EventConsumer(
            EventConsumer.Config(bootstrap_servers="127.0.0.1:1", topics=["t"], dlq_topic=None, **config)
        )
        consumer._consumer.close()
        fake = consumer._consumer = _FakeKafka(messages, per_call)
        made.append(consumer)
        return consumer, fake

    yield make
    for consumer in made:
        consumer.close()


def test_a_batch_is_read_in_chunks_with_the_same_events_and_limit(make_consumer: Any) -> None:
    consumer, fake = make_consumer(_messages(200, bad_at=70), decode_chunk=64)
    events = consumer.consume(150, timeout=1.0)
    assert [c[0] for c in fake.calls] == [64, 64, 22]  # never more than max_records messages taken
    assert [e.offset for e in events] == [i for i in range(150) if i != 70]  # the bad one dead-lettered
    assert events[3].value.trajectory_id == "traj-3" and events[3].timestamp_ms == 1003
    assert consumer.num_dead_letters == 1
    rest = consumer.consume(150, timeout=0.0)
    assert fake.calls[3:] == [(64, 0, False)] and [e.offset for e in rest] == list(range(150, 200))


def test_a_short_chunk_waits_what_is_left_of_the_timeout_with_the_collector_on(make_consumer: Any) -> None:
    consumer, fake = make_consumer(_messages(100), per_call=40, decode_chunk=64)
    assert len(consumer.consume(100, timeout=5.0)) == 100
    (first, _, gc_first), (rest, waited, gc_waiting), *others = fake.calls
    assert (first, rest, gc_first, gc_waiting) == (64, 24, False, True) and 4.0 < waited <= 5.0
    assert others == [(36, 0, False)] and gc.isenabled()
    consumer, fake = make_consumer(_messages(50), per_call=40, decode_chunk=64)
    assert len(consumer.consume(64, timeout=-1)) == 50  # librdkafka's "wait as long as it takes"
    assert fake.calls == [(64, 0, False), (24, -1.0, True)]


def test_decode_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="decode_chunk"):
        EventConsumer.Config(topics=["t"], decode_chunk=0)


def test_the_collector_is_paused_while_a_batch_is_decoded(make_consumer: Any) -> None:
    seen: list[bool] = []
    consumer, _ = make_consumer([])
    consumer._validator = lambda record: seen.append(gc.isenabled())
    consumer._consumer = _FakeKafka(_messages(3))
    assert gc.isenabled()
    assert len(consumer.consume(10, timeout=0.0)) == 3
    assert seen == [False, False, False] and gc.isenabled()


def test_the_pause_restores_the_state_it_found() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), _CollectorPause():
        assert not gc.isenabled()
        raise RuntimeError("decode failed")
    assert gc.isenabled()  # re-enabled after an error too
    gc.disable()
    try:
        with _CollectorPause() as pause:
            assert not gc.isenabled()
            with pause.lifted():
                assert not gc.isenabled()  # not ours to start
        assert not gc.isenabled()  # the caller's own pause is left alone
    finally:
        gc.enable()


class _BusyCoordinator(_FakeKafka):
    """A commit that meets a coordinator still loading after a broker restart `busy` times."""

    def __init__(self, busy: int, code: int) -> None:
        super().__init__([])
        self.busy, self.code, self.commits = busy, code, 0

    def commit(self, **kwargs: Any) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self.commits += 1
        if self.commits <= self.busy:
            raise KafkaException(KafkaError(self.code))


def test_a_commit_waits_out_a_coordinator_that_is_loading(
    make_consumer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a broker restart the first commits met COORDINATOR_LOAD_IN_PROGRESS and _WAIT_COORD
    and the trainer exited, spending its restart budget on a broker that came back in seconds."""
    from confluent_kafka import KafkaError

    from stacx.consumers.event_consumer import time as clock

    monkeypatch.setattr(clock, "sleep", lambda s: None)
    for code in (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._WAIT_COORD):
        consumer, _ = make_consumer([])
        fake = consumer._consumer = _BusyCoordinator(3, code)
        consumer.commit()
        assert fake.commits == 4


def test_a_commit_refused_or_failed_otherwise_is_not_retried(make_consumer: Any) -> None:
    from confluent_kafka import KafkaError

    from stacx.consumers import CommitRefusedError, ConsumerError

    consumer, _ = make_consumer([])
    fake = consumer._consumer = _BusyCoordinator(1, KafkaError.ILLEGAL_GENERATION)
    with pytest.raises(CommitRefusedError):
        consumer.commit()
    assert fake.commits == 1
    fake = consumer._consumer = _BusyCoordinator(1, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(ConsumerError, match="commit failed"):
        consumer.commit()
    assert fake.commits == 1
