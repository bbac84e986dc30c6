"""Proxy metrics on `prometheus_client` (`GET /metrics`), safe to update from any thread."""

from __future__ import annotations

from stacx.rollout.inference.metrics import LATENCY_BUCKETS_S, PrometheusMetrics

__all__ = ["ProxyMetrics"]

_COUNTERS = (
    "requests_total",
    "requests_failed_total",
    "requests_invalid_total",
    "upstream_retried_total",
    "sessions_repinned_total",
    "events_recorded_total",
    "events_published_total",
    "events_dropped_total",
    "delivery_failures_total",
    "events_dead_lettered_total",
)
_GAUGES = ("buffered_events", "degraded", "pinned_sessions")


class ProxyMetrics(PrometheusMetrics):
    """Counters (`*_total`), gauges and the request latency histogram of one proxy."""

    PREFIX = "stacx_proxy_"

    def __init__(self) -> None:
        super().__init__(_COUNTERS, _GAUGES, {"request_latency_seconds": LATENCY_BUCKETS_S})

    def observe_latency(self, seconds: float) -> None:
        self.observe("request_latency_seconds", seconds)
