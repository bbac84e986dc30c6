"""Server metrics, rendered in the Prometheus text format at `GET /metrics`.

The decode batch-size histogram makes batching observable: with concurrent requests its upper
buckets fill, with one request at a time only `le="1"` does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["Histogram", "Metrics", "PrometheusMetrics"]

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS_S: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass(slots=True)
class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics)."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def render(self, name: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        for bound, count in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{name}_bucket{{le="{bound:g}"}} {count}')
        lines += [
            f'{name}_bucket{{le="+Inf"}} {self.count}',
            f"{name}_sum {self.total:g}",
            f"{name}_count {self.count}",
        ]
        return lines


class PrometheusMetrics:
    """Counters, gauges and histograms under one name prefix, rendered in the Prometheus text
    format; safe to update from any thread. Subclasses name their series."""

    PREFIX = ""

    def __init__(
        self, counters: tuple[str, ...], gauges: tuple[str, ...], histograms: dict[str, Histogram]
    ) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = dict.fromkeys(counters, 0)
        self.gauges: dict[str, float] = dict.fromkeys(gauges, 0)
        self.histograms = histograms

    def inc(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self.counters[name] += amount

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = value

    def observe(self, histogram: str, value: float) -> None:
        with self._lock:
            self.histograms[histogram].observe(value)

    def snapshot(self) -> dict[str, float]:
        """Counters and gauges by name (tests and logs)."""
        with self._lock:
            return {**self.counters, **self.gauges}

    def render(self) -> str:
        """Prometheus text exposition."""
        with self._lock:
            lines: list[str] = []
            for name, value in self.counters.items():
                lines += [f"# TYPE {self.PREFIX}{name} counter", f"{self.PREFIX}{name} {value:g}"]
            for name, value in self.gauges.items():
                lines += [f"# TYPE {self.PREFIX}{name} gauge", f"{self.PREFIX}{name} {value:g}"]
            for name, histogram in self.histograms.items():
                lines += histogram.render(f"{self.PREFIX}{name}")
        return "\n".join(lines) + "\n"


class Metrics(PrometheusMetrics):
    """Counters, gauges and histograms of one inference server."""

    PREFIX = "stacx_inference_"

    def __init__(self) -> None:
        self.batch_size = Histogram(BATCH_SIZE_BUCKETS)
        """Rows per decode step."""
        self.request_latency = Histogram(LATENCY_BUCKETS_S)
        """Seconds from arrival to the last token."""
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
            {"batch_size": self.batch_size, "request_latency_seconds": self.request_latency},
        )

    def observe_batch(self, size: int) -> None:
        with self._lock:
            self.batch_size.observe(size)
            self.counters["decode_steps_total"] += 1

    def observe_prefix_cache(self, hit_tokens: int, query_tokens: int) -> None:
        """Prompt tokens served from the prefix cache out of those admitted; updates the rate."""
        with self._lock:
            self.counters["prefix_cache_hit_tokens_total"] += hit_tokens
            self.counters["prefix_cache_query_tokens_total"] += query_tokens
            queried = self.counters["prefix_cache_query_tokens_total"]
            hits = self.counters["prefix_cache_hit_tokens_total"]
            self.gauges["prefix_cache_hit_rate"] = hits / queried if queried else 0.0

    def observe_latency(self, seconds: float) -> None:
        self.observe("request_latency_seconds", seconds)
