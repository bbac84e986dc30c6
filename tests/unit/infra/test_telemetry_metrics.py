"""OpenTelemetry metrics of the services: the Prometheus scrape endpoint a service serves, and the
OTEL_* variables and the pipeline section that ask for them (the rollout's instruments:
tests/unit/rollout/test_rollout_tracing.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from ports import free_port

from stacx.infra.telemetry import MetricsConfig, TracingConfig


def test_a_service_serves_its_metrics_for_prometheus_to_scrape() -> None:
    port = free_port()
    script = textwrap.dedent(f"""
        import httpx
        from stacx.infra.telemetry import MetricsConfig, setup_metrics
        from stacx.rollout import manager
        where = setup_metrics("rollout", MetricsConfig(exporter="prometheus", port={port}))
        manager._EPISODES.add(3, {{"status": "COMPLETED", "task_type": "t"}})
        print(where)
        print(httpx.get(where, timeout=10).text)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == f"http://127.0.0.1:{port}/metrics"
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("stacx_rollout_episodes_total{")]
    assert 'status="COMPLETED",task_type="t"' in line and line.endswith(" 3.0"), line


def test_metrics_config_from_the_otel_variables() -> None:
    assert MetricsConfig.from_env({}).exporter == "none"
    prom = MetricsConfig.from_env(
        {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "9500"}
    )
    assert (prom.exporter, prom.host, prom.port) == ("prometheus", "127.0.0.1", 9500)
    with pytest.raises(ValueError, match="OTEL_METRICS_EXPORTER='statsd'"):
        MetricsConfig.from_env({"OTEL_METRICS_EXPORTER": "statsd"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_PROMETHEUS_PORT='x'"):
        MetricsConfig.from_env({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "x"})


def test_the_pipeline_section_gives_each_service_its_own_scrape_port() -> None:
    section = TracingConfig(enabled=False, metrics="prometheus", metrics_port=9600)
    first, third = section.to_env(0), section.to_env(2)
    assert (
        first["OTEL_EXPORTER_PROMETHEUS_PORT"] == "9600" and third["OTEL_EXPORTER_PROMETHEUS_PORT"] == "9602"
    )
    assert MetricsConfig.from_env(third).port == 9602
    assert not TracingConfig.from_env(third).enabled  # metrics alone do not turn tracing on



_RECORD_DURATIONS = """
import json
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
import stacx.consumers.weights as weights
import stacx.trainer.engine as engine

weights._SWAP_SECONDS.record(0.3)
engine._STEP_SECONDS.record(4.0)
data = reader.get_metrics_data()
print(json.dumps({m.name: list(m.data.data_points[0].explicit_bounds)
                  for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}))
"""


def test_histograms_in_seconds_have_bucket_bounds_in_seconds() -> None:
    """The SDK's default bounds (0 .. 10,000) are for milliseconds: a 0.3 s swap and a 4 s step
    would share a bucket. Each second-valued histogram advises `SECONDS_BUCKETS` (a process of its
    own: the meter provider can be set once per process)."""
    import json
    import subprocess
    import sys

    from stacx.producers.tracing import SECONDS_BUCKETS

    argv = [sys.executable, "-c", _RECORD_DURATIONS]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    bounds = json.loads(done.stdout.strip().splitlines()[-1])
    assert bounds == {
        "stacx.weights.swap_duration": list(SECONDS_BUCKETS),
        "stacx.trainer.step_duration": list(SECONDS_BUCKETS),
    }
