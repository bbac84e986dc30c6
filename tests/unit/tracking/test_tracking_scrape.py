"""Server figures between two scrapes of a real `prometheus_client` exposition."""

from __future__ import annotations

import pytest

from stacx.infra.tracking import MetricsEndpoint
from stacx.infra.tracking.scrape import ScrapeRates
from stacx.rollout.inference.metrics import Metrics


def test_counters_become_rates_gauges_values_and_histograms_means() -> None:
    metrics = Metrics()
    rates = ScrapeRates(MetricsEndpoint("inference", "http://127.0.0.1:1/metrics"))
    metrics.inc("generated_tokens_total", 100)
    metrics.set("running_requests", 3)
    metrics.observe_latency(1.0)
    first = rates.figures(metrics.render(), now=10.0)
    assert first["inference/running_requests"] == 3.0
    assert "inference/generated_tokens_per_s" not in first  # a rate needs two scrapes

    metrics.inc("generated_tokens_total", 50)
    metrics.observe_latency(2.0)
    metrics.observe_latency(4.0)
    second = rates.figures(metrics.render(), now=15.0)
    assert second["inference/generated_tokens_per_s"] == pytest.approx(10.0)
    assert second["inference/requests_per_s"] == 0.0
    assert second["inference/request_latency_seconds_mean"] == pytest.approx(3.0)  # of the two since
    assert "inference/batch_size_mean" not in second  # nothing observed since: no mean


def test_the_created_timestamps_of_counters_and_histograms_are_no_figures() -> None:
    metrics = Metrics()
    metrics.inc("generated_tokens_total", 1)
    metrics.observe_latency(1.0)
    text = metrics.render()
    assert "stacx_inference_generated_tokens_created" in text  # prometheus_client writes them
    rates = ScrapeRates(MetricsEndpoint("inference", "http://127.0.0.1:1/metrics"))
    first = rates.figures(text, now=1.0)
    second = rates.figures(metrics.render(), now=2.0)
    assert not [name for name in {**first, **second} if name.endswith("_created")]
    assert "inference/generated_tokens_per_s" in second


def test_a_gauge_of_our_own_that_ends_in_created_stays() -> None:
    text = "# TYPE stacx_gateway_sessions_created gauge\nstacx_gateway_sessions_created 3\n"
    rates = ScrapeRates(MetricsEndpoint("gateway", "http://127.0.0.1:1/metrics"))
    assert rates.figures(text, now=1.0) == {"gateway/sessions_created": 3.0}
