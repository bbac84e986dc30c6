"""Server metrics on `prometheus_client`, exposed at `GET /metrics`.

The decode batch-size histogram makes batching observable: with concurrent requests its upper
buckets fill, with one request at a time only `le="1.0"` does.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics", "PrometheusMetrics"]

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS_S: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class PrometheusMetrics:
    """Counters (`*_total`), gauges and histograms under one name prefix, in a registry of their
    own (two servers in one process do not share series); safe to update from any thread.
    Subclasses name their series; `histograms` maps a name to its bucket bounds."""

    PREFIX = ""

    def __init__(
        self, counters: tuple[str, ...], gauges: tuple[str, ...], histograms: Mapping[str, tuple[float, ...]]
    ) -> None:
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        self._counters = {
            name: Counter(self.PREFIX + name.removesuffix("_total"), name, registry=self.registry)
            for name in counters
        }
        self._gauges = {name: Gauge(self.PREFIX + name, name, registry=self.registry) for name in gauges}
        self._histograms = {
            name: Histogram(self.PREFIX + name, name, buckets=buckets, registry=self.registry)
            for name, buckets in histograms.items()
        }
        self._counts: dict[str, float] = dict.fromkeys(counters, 0.0)
        self._levels: dict[str, float] = dict.fromkeys(gauges, 0.0)

    @property
    def counters(self) -> Mapping[str, float]:
        """Counter values by name (tests, logs, `/server_info`)."""
        with self._lock:
            return dict(self._counts)

    @property
    def gauges(self) -> Mapping[str, float]:
        with self._lock:
            return dict(self._levels)

    def inc(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._counters[name].inc(amount)
            self._counts[name] += amount

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name].set(value)
            self._levels[name] = value

    def observe(self, histogram: str, value: float) -> None:
        self._histograms[histogram].observe(value)

    def snapshot(self) -> dict[str, float]:
        """Counters and gauges by name (tests and logs)."""
        with self._lock:
            return {**self._counts, **self._levels}

    def render(self) -> str:
        """Prometheus text exposition (`prometheus_client`)."""
        return generate_latest(self.registry).decode()


class Metrics(PrometheusMetrics):
    """Counters, gauges and histograms of one inference server."""

    PREFIX = "stacx_inference_"

    def __init__(self) -> None:
        super().__init__(
            (
                "requests_total",
                "requests_failed_total",
                "requests_invalid_total",
                "requests_aborted_total",
                "prompt_tokens_total",
                "generated_tokens_total",
                "decode_steps_total",
                "prefill_batches_total",
                "weight_updates_total",
                "prefix_cache_hit_tokens_total",
                "prefix_cache_query_tokens_total",
            ),
            ("running_requests", "waiting_requests", "prefix_cache_tokens", "prefix_cache_hit_rate"),
            # rows per decode step; seconds from arrival to the last token
            {"batch_size": BATCH_SIZE_BUCKETS, "request_latency_seconds": LATENCY_BUCKETS_S},
        )

    def observe_batch(self, size: int) -> None:
        self.observe("batch_size", size)
        self.inc("decode_steps_total")

    def observe_prefix_cache(self, hit_tokens: int, query_tokens: int) -> None:
        """Prompt tokens served from the prefix cache out of those admitted; updates the rate."""
        self.inc("prefix_cache_hit_tokens_total", hit_tokens)
        self.inc("prefix_cache_query_tokens_total", query_tokens)
        counts = self.counters
        queried, hits = counts["prefix_cache_query_tokens_total"], counts["prefix_cache_hit_tokens_total"]
        self.set("prefix_cache_hit_rate", hits / queried if queried else 0.0)

    def observe_latency(self, seconds: float) -> None:
        self.observe("request_latency_seconds", seconds)
