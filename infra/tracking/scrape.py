"""The services' Prometheus endpoints, turned into figures between two scrapes.

Counters become rates (`<name>_per_s`), gauges their value, histograms the mean of the values
observed between the scrapes (`<name>_mean`). Names lose the service's `stacx_<service>_` prefix
and get the endpoint's (`inference/generated_tokens_per_s`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["MetricsEndpoint", "ScrapeRates", "parse_exposition"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    """A service's `/metrics` URL, and the name its figures go under."""

    name: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent with each scrape (`Authorization` for the sandbox gateway)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One scrape's values: counters (`_total`), gauges, histogram sums and counts."""

    counters: dict[str, float]
    gauges: dict[str, float]
    histograms: dict[str, tuple[float, float]]
    """name -> (sum, count)."""


def parse_exposition(text: str) -> Sample:
    """Prometheus text exposition (`prometheus_client`'s own parser), label sets summed. The
    `<name>_created` gauge a counter or histogram carries in the text format (its creation time,
    a Unix timestamp) is no figure and is left out."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    families = list(text_string_to_metric_families(text))
    created = {f"{f.name}_created" for f in families if f.type in ("counter", "histogram", "summary")}
    for family in families:
        if family.name in created:
            continue
        for sample in family.samples:
            name = _short(family.name)
            if family.type == "counter" and sample.name.endswith("_total"):
                counters[name] = counters.get(name, 0.0) + sample.value
            elif family.type == "gauge":
                gauges[name] = gauges.get(name, 0.0) + sample.value
            elif family.type == "histogram" and sample.name.endswith("_sum"):
                sums[name] = sums.get(name, 0.0) + sample.value
            elif family.type == "histogram" and sample.name.endswith("_count"):
                counts[name] = counts.get(name, 0.0) + sample.value
    histograms = {n: (sums[n], counts.get(n, 0.0)) for n in sums}
    return Sample(counters=counters, gauges=gauges, histograms=histograms)


def _short(name: str) -> str:
    """`stacx_inference_generated_tokens` -> `generated_tokens`."""
    if name.startswith("stacx_"):
        return name.removeprefix("stacx_").partition("_")[2] or name
    return name


class ScrapeRates:
    """Figures of one endpoint between consecutive scrapes."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint
        self._last: tuple[float, Sample] | None = None

    def figures(self, text: str, now: float) -> dict[str, float]:
        """Figures since the previous scrape (gauges only on the first)."""
        sample = parse_exposition(text)
        last, self._last = self._last, (now, sample)
        prefix = self.endpoint.name + "/"
        figures = {prefix + n: v for n, v in sample.gauges.items()}
        if last is None or now <= last[0]:
            return figures
        elapsed, before = now - last[0], last[1]
        for name, value in sample.counters.items():
            figures[f"{prefix}{name}_per_s"] = max(0.0, value - before.counters.get(name, 0.0)) / elapsed
        for name, (total, count) in sample.histograms.items():
            old_total, old_count = before.histograms.get(name, (0.0, 0.0))
            if count > old_count:
                figures[f"{prefix}{name}_mean"] = (total - old_total) / (count - old_count)
        return figures
