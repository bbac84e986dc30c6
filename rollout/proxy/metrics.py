"""Proxy metrics in the Prometheus text format (`GET /metrics`), safe to update from any thread."""

from __future__ import annotations

import threading

from rollout.inference.metrics import LATENCY_BUCKETS_S, Histogram

__all__ = ["ProxyMetrics"]

_COUNTERS = (
    "requests_total",
    "requests_failed_total",
    "upstream_retried_total",
    "sessions_repinned_total",
    "events_recorded_total",
    "events_published_total",
    "events_dropped_total",
    "delivery_failures_total",
)
_GAUGES = ("buffered_events", "degraded", "pinned_sessions")


class ProxyMetrics:
    """Counters (`*_total`), gauges and the request latency histogram of one proxy."""

    PREFIX = "stacx_proxy_"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self.gauges: dict[str, float] = dict.fromkeys(_GAUGES, 0)
        self.latency = Histogram(LATENCY_BUCKETS_S)

    def inc(self, name: str, value: float = 1) -> None:
        with self._lock:
            self.counters[name] += value

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = value

    def observe_latency(self, seconds: float) -> None:
        with self._lock:
            self.latency.observe(seconds)

    def snapshot(self) -> dict[str, float]:
        """Counters and gauges by name (tests and logs)."""
        with self._lock:
            return {**self.counters, **self.gauges}

    def render(self) -> str:
        with self._lock:
            lines: list[str] = []
            for name, value in self.counters.items():
                lines += [f"# TYPE {self.PREFIX}{name} counter", f"{self.PREFIX}{name} {value:g}"]
            for name, value in self.gauges.items():
                lines += [f"# TYPE {self.PREFIX}{name} gauge", f"{self.PREFIX}{name} {value:g}"]
            lines += self.latency.render(f"{self.PREFIX}request_latency_seconds")
        return "\n".join(lines) + "\n"
