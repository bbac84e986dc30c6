"""aiokafka's repeated "topic not found" lines pass once per topic per interval; others always."""

from __future__ import annotations

import logging

from stacx.consumers.assembly.missing import AIOKAFKA_CLUSTER_LOGGER, OncePerTopic


def _line(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(AIOKAFKA_CLUSTER_LOGGER, logging.WARNING, __file__, 1, msg, args, None)


def test_a_missing_topic_is_said_once_per_topic_per_interval_and_other_lines_pass() -> None:
    now = [0.0]
    once = OncePerTopic(every_s=300.0, clock=lambda: now[0])
    missing = "Topic %s not found in cluster metadata"
    assert once.filter(_line(missing, "stacx.batches.a"))
    assert once.filter(_line(missing, "stacx.batches.b"))  # another topic: its own line
    now[0] = 100.0
    assert not once.filter(_line(missing, "stacx.batches.a"))
    assert not once.filter(_line(missing, "stacx.batches.a"))
    assert all(once.filter(_line("metadata answered by %s", "node-1")) for _ in range(3))
    now[0] = 300.0
    again = _line(missing, "stacx.batches.a")
    assert once.filter(again)
    assert again.getMessage() == ("Topic stacx.batches.a not found in cluster metadata "
                                  "(2 alike held back in the last 300 s)")
    assert once.held_back == 2
