"""librdkafka's log lines through Python logging, each kind of line at most once per interval.

Left to itself librdkafka writes its lines straight to stderr: a client whose broker is away (a
broker restart, a network blip) prints a `FAIL ... Connection refused` line per connection attempt,
about twenty a second per client, so a service's log drowns in them. Every Kafka client of STACX
hands its lines to the `stacx.kafka` logger instead (confluent-kafka's `logger` setting: the lines
arrive on the thread that polls the client, never on one of librdkafka's), where `RepeatFilter`
lets the first line of a kind through and holds back the ones alike that follow within the
interval; the next line of that kind that passes says how many were held back.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

__all__ = ["KAFKA_LOGGER", "LIBRARY_LOGGERS", "RepeatFilter", "kafka_logger", "limit_library_logs"]

LIBRARY_LOGGERS = ("aiokafka",)
"""Python Kafka clients (Faust's aiokafka) that log every failed attempt while a broker is away:
about 100 ERROR lines a second from an assembler during an outage."""

KAFKA_LOGGER = "stacx.kafka"
"""The logger every STACX Kafka client's librdkafka lines go to."""

DEFAULT_EVERY_S = 30.0
"""How long lines alike are held back after one passed."""

_NUMBERS = re.compile(r"\d+")
_lock = threading.Lock()


class RepeatFilter(logging.Filter):
    """Passes a line, then holds back the lines alike (the same text once numbers are set aside:
    counters, milliseconds, client numbers) for `every_s` seconds; the next one that passes ends
    with how many were held back."""

    def __init__(self, every_s: float = DEFAULT_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._passed: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self.held_back = 0
        """Lines held back since this filter was made."""

    def kind(self, record: logging.LogRecord) -> str | None:
        """What makes lines alike: the text with its numbers set aside (None: always passes)."""
        return _NUMBERS.sub("#", record.getMessage())

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self.kind(record)
        if kind is None:
            return True
        text = record.getMessage()
        now = self._clock()
        with self._lock:
            last = self._passed.get(kind)
            if last is not None and now - last < self.every_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                self.held_back += 1
                return False
            self._forget_before(now - self.every_s)
            self._passed[kind] = now
            held = self._held.pop(kind, 0)
        if held:
            record.msg = f"{text} ({held} alike held back in the last {self.every_s:.0f} s)"
            record.args = None
        return True

    def _forget_before(self, cutoff: float) -> None:
        """Drop the kinds whose last line passed before `cutoff` and held none back since."""
        for kind in [k for k, at in self._passed.items() if at < cutoff and k not in self._held]:
            del self._passed[kind]


def kafka_logger() -> logging.Logger:
    """The `stacx.kafka` logger with its `RepeatFilter` (added once per process); pass it as the
    `logger` setting of a confluent-kafka client."""
    logger = logging.getLogger(KAFKA_LOGGER)
    with _lock:
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(RepeatFilter())
    return logger


_library_filter = RepeatFilter()


def limit_library_logs(prefixes: tuple[str, ...] = LIBRARY_LOGGERS) -> RepeatFilter:
    """Put one `RepeatFilter` on every logger of the libraries named by `prefixes` that exists now
    (call it after importing them): a filter of a parent logger does not see its children's
    records, so each gets the shared one. Returns it (its `held_back` counts what it held)."""
    with _lock:
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger) and name.split(".")[0] in prefixes:
                if _library_filter not in logger.filters:
                    logger.addFilter(_library_filter)
    return _library_filter
