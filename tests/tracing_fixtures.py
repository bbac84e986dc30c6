"""An in-memory OpenTelemetry SDK for tests: spans are kept in a list instead of exported; and the
local Jaeger the tracing integration tests export to."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from stacx.infra.services.jaeger import JaegerConfig


@contextmanager
def in_memory_tracing(provider: TracerProvider | None = None) -> Iterator[InMemorySpanExporter]:
    """Install a recording TracerProvider (`provider`, or a default one) for the block (what a
    service's set-up does), then put the previous (no-op) one back so that other tests run with
    tracing off."""
    exporter = InMemorySpanExporter()
    provider = provider or TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


@contextmanager
def in_memory_metrics() -> Iterator[InMemoryMetricReader]:
    """Install a MeterProvider with an in-memory reader for the block (then the no-op one again)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    saved = metrics_internal._METER_PROVIDER, metrics_internal._METER_PROVIDER_SET_ONCE
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics.set_meter_provider(provider)
    try:
        yield reader
    finally:
        metrics_internal._METER_PROVIDER, metrics_internal._METER_PROVIDER_SET_ONCE = saved


def metric_points(reader: InMemoryMetricReader) -> dict[str, list]:
    """Data points by metric name."""
    data = reader.get_metrics_data()
    found: dict[str, list] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def running_jaeger() -> JaegerConfig:
    """The local Jaeger's settings once its query API answers; fails the test with the fix if not."""
    config = JaegerConfig()
    try:
        httpx.get(f"{config.query_url}/api/services", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        pytest.fail(
            f"no Jaeger query API answers at {config.query_url} ({type(exc).__name__}): the tracing "
            "tests need the local trace backend; start it with `stacx infra up` (it builds Jaeger once)",
            pytrace=False,
        )
    return config
