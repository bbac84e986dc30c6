"""librdkafka's lines go through the `stacx.kafka` logger, each kind at most once per interval."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from stacx.producers.kafka_log import KAFKA_LOGGER, RepeatFilter, kafka_logger


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord(KAFKA_LOGGER, logging.ERROR, __file__, 1, "%s", (text,), None)


def test_lines_alike_pass_once_per_interval_and_the_next_says_how_many_were_held() -> None:
    now = [0.0]
    repeat = RepeatFilter(every_s=10.0, clock=lambda: now[0])
    refused = "FAIL [rdkafka#consumer-1] 127.0.0.1:9092: Connection refused (after {} ms in state CONNECT)"
    assert repeat.filter(_record(refused.format(0)))
    for ms in range(1, 6):  # the same line but for its numbers: held back
        now[0] += 1.0
        assert not repeat.filter(_record(refused.format(ms)))
    other = _record("rebalance: assigned 3 partitions")
    assert repeat.filter(other) and other.getMessage() == "rebalance: assigned 3 partitions"
    now[0] = 10.0  # the interval since the first line passed is over
    late = _record(refused.format(7))
    assert repeat.filter(late)
    assert late.getMessage() == refused.format(7) + " (5 alike held back in the last 10 s)"
    now[0] = 10.5
    assert not repeat.filter(_record(refused.format(8)))


def test_a_line_with_a_percent_sign_is_kept_as_it_is() -> None:
    now = [0.0]
    repeat = RepeatFilter(every_s=1.0, clock=lambda: now[0])
    assert repeat.filter(_record("100% of the queue"))
    assert not repeat.filter(_record("100% of the queue"))
    now[0] = 2.0
    record = _record("100% of the queue")
    assert repeat.filter(record)
    assert record.getMessage() == "100% of the queue (1 alike held back in the last 1 s)"


def test_the_product_clients_log_through_the_filtered_logger() -> None:
    from stacx.consumers.event_consumer import EventConsumer
    from stacx.producers.event_producer import EventProducer

    logger = kafka_logger()
    assert kafka_logger() is logger and sum(isinstance(f, RepeatFilter) for f in logger.filters) == 1
    producer = EventProducer._librdkafka_config(EventProducer.Config(bootstrap_servers="127.0.0.1:9"))
    consumer = EventConsumer._librdkafka_config(
        EventConsumer.Config(bootstrap_servers="127.0.0.1:9", group_id="g", topics=["t"])
    )
    assert producer["logger"] is logger and consumer["logger"] is logger


def test_a_client_whose_broker_is_away_logs_one_refused_line_not_one_per_attempt(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real librdkafka consumer pointed at a port nobody listens on tries to connect many times
    a second; through `kafka_logger()` one line of the kind reaches the log."""
    from confluent_kafka import Consumer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: connections are refused
    repeat = RepeatFilter()  # this test's own: an earlier test's refused line is not held against it
    monkeypatch.setattr(logging.getLogger(KAFKA_LOGGER), "filters", [repeat])
    assert kafka_logger().filters == [repeat]
    held_before = repeat.held_back
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "stacx-test-kafka-log",
            "logger": kafka_logger(),
        }
    )
    try:
        consumer.subscribe(["stacx-test-kafka-log"])
        caplog.set_level(logging.DEBUG, logger=KAFKA_LOGGER)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            consumer.poll(0.2)
    finally:
        consumer.close()
    refused = [r for r in caplog.records if r.name == KAFKA_LOGGER and "Connection refused" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]
    assert repeat.held_back - held_before >= 5  # librdkafka did try again and again


def test_aiokafka_lines_of_an_outage_are_held_back_like_librdkafkas(caplog: pytest.LogCaptureFixture) -> None:
    """Faust's aiokafka logs an ERROR per failed attempt (~100/s from an assembler during an
    outage); after `limit_library_logs` the lines alike pass once per interval."""
    import aiokafka.conn  # noqa: F401  (its loggers exist once it is imported)

    from stacx.producers.kafka_log import limit_library_logs

    shared = limit_library_logs()
    before = shared.held_back
    logger = logging.getLogger("aiokafka.conn")
    with caplog.at_level(logging.ERROR, logger="aiokafka"):
        for attempt in range(100):
            logger.error(
                "Unable to connect to node with id %d: [Errno 111] Connect call failed (%d)", 1, attempt
            )
    passed = [r for r in caplog.records if r.name == "aiokafka.conn"]
    assert len(passed) <= 1 and shared.held_back - before >= 99
