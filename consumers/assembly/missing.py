"""An output topic that disappears (deleted under a running assembler) is said once, not
thousands of times a second.

While a topic it writes to is missing, aiokafka asks for metadata every 100 ms and logs
"Topic X not found in cluster metadata" for every missing topic at every answer (about 1,700
lines a second were seen). `OncePerTopic` lets such a line through once per topic per
`every_s`; the assembler says itself which topic is missing and what it does meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["AIOKAFKA_CLUSTER_LOGGER", "OncePerTopic", "quiet_missing_topics"]

AIOKAFKA_CLUSTER_LOGGER = "aiokafka.cluster"
"""The logger whose metadata errors repeat at every metadata answer."""
_REPEATED = ("Topic %s not found in cluster metadata", "Error fetching metadata for topic %s: %s")


class OncePerTopic(logging.Filter):
    """Passes a repeated metadata error once per topic every `every_s` seconds."""

    def __init__(self, every_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in _REPEATED or not record.args:
            return True
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        key = (str(record.msg), str(args[0]))
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            return False
        self._last[key] = now
        return True


def quiet_missing_topics(every_s: float = 300.0) -> None:
    """Install `OncePerTopic` on aiokafka's cluster logger (idempotent)."""
    logger = logging.getLogger(AIOKAFKA_CLUSTER_LOGGER)
    if not any(isinstance(f, OncePerTopic) for f in logger.filters):
        logger.addFilter(OncePerTopic(every_s))
