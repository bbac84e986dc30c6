"""An output topic that disappears (deleted under a running assembler) is said once, not
thousands of times a second.

While a topic it writes to is missing, aiokafka asks for metadata every 100 ms and logs
"Topic X not found in cluster metadata" for every missing topic at every answer (about 1,700
lines a second were seen). `OncePerTopic` lets such a line through once per topic per
`every_s` (a `RepeatFilter` keyed by message and topic, which counts what it held back); the
assembler says itself which topic is missing and what it does meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from stacx.producers.kafka_log import RepeatFilter

__all__ = ["AIOKAFKA_CLUSTER_LOGGER", "OncePerTopic", "quiet_missing_topics"]

AIOKAFKA_CLUSTER_LOGGER = "aiokafka.cluster"
"""The logger whose metadata errors repeat at every metadata answer."""
_REPEATED = ("Topic %s not found in cluster metadata", "Error fetching metadata for topic %s: %s")


class OncePerTopic(RepeatFilter):
    """Passes a repeated metadata error once per topic every `every_s` seconds; other lines pass."""

    def __init__(self, every_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(every_s, clock)

    def kind(self, record: logging.LogRecord) -> str | None:
        if record.msg not in _REPEATED or not record.args:
            return None
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        return f"{record.msg}\0{args[0]}"


def quiet_missing_topics(every_s: float = 300.0) -> None:
    """Install `OncePerTopic` on aiokafka's cluster logger (idempotent)."""
    logger = logging.getLogger(AIOKAFKA_CLUSTER_LOGGER)
    if not any(isinstance(f, OncePerTopic) for f in logger.filters):
        logger.addFilter(OncePerTopic(every_s))
