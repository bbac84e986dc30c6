"""OpenTelemetry SDK set-up for every `stacx` service, from one config section or the OTEL_* variables.

Library code (rollout, sandbox, producers, consumers, trainer) only calls the OpenTelemetry API;
this module installs the plain OpenTelemetry SDK in a service's process: a `TracerProvider` with
the resource `service.name`, the SDK's `BatchSpanProcessor` with its OTLP/HTTP exporter, and a
parent-based ratio sampler (head sampling: `OTEL_TRACES_SAMPLER_ARG` or `tracing.sample_ratio`).
Context travels with the SDK's default propagators (W3C trace context and baggage).
Tracing is on when the pipeline's `tracing:` section says so (it is passed to each service as the
standard variables) or when the environment asks for OTLP: `OTEL_TRACES_EXPORTER=otlp` or an
`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`
turn it off. Off, nothing is installed and the API's no-op tracer
costs nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

__all__ = [
    "MetricsConfig",
    "TracingConfig",
    "dropped_spans",
    "sampler",
    "setup_metrics",
    "setup_tracing",
    "shutdown_tracing",
]

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
"""OTLP/HTTP on the local Jaeger that `stacx infra up` starts."""

DEFAULT_EXPORT_DELAY_MS = 5000
"""OpenTelemetry's own default: one OTLP request per service every 5 s (or per 512 spans) rather
than every second: a fifth of the exporter's wake-ups, requests and per-batch encoding."""

PROCESSED_SPANS = "otel.sdk.processor.span.processed"
"""The SDK span processor's own counter (semantic conventions); `error.type` marks dropped spans."""

_installed: list[object] = []
_processor_readers: list[InMemoryMetricReader] = []


class TracingConfig(BaseModel):
    """The `tracing:` section: one place that turns tracing on for every service of a pipeline."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Export spans from every service (the standard OTEL_* variables can also turn it on)."""
    endpoint: str = DEFAULT_ENDPOINT
    """OTLP/HTTP base URL (`/v1/traces` is appended), the local Jaeger by default."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Fraction of traces kept (parent-based: a trace is kept or dropped as a whole)."""
    export_delay_ms: int = Field(default=DEFAULT_EXPORT_DELAY_MS, ge=10)
    """Longest time a finished span waits in the batch before it is exported (a full batch of
    512 spans goes at once)."""
    metrics: Literal["none", "prometheus", "otlp"] = "none"
    """OpenTelemetry metrics of every service (episodes, staleness, tokens, batches, step time, swap
    latency): a Prometheus scrape endpoint per service, or OTLP to `endpoint`."""
    metrics_port: int = Field(default=9464, ge=1, le=65535)
    """With `prometheus`: the first service's scrape port on 127.0.0.1; the next ones count up."""

    def to_env(self, service_index: int = 0) -> dict[str, str]:
        """The standard OTEL_* variables that carry this section to a service process (the
        `service_index`-th of the pipeline: its Prometheus port)."""
        env: dict[str, str] = {"OTEL_METRICS_EXPORTER": self.metrics}
        if self.metrics != "none":
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.endpoint
        if self.metrics == "prometheus":
            env["OTEL_EXPORTER_PROMETHEUS_HOST"] = "127.0.0.1"
            env["OTEL_EXPORTER_PROMETHEUS_PORT"] = str(self.metrics_port + service_index)
        if not self.enabled:
            return {**env, "OTEL_TRACES_EXPORTER": "none"}
        return env | {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(self.sample_ratio),
            "OTEL_BSP_SCHEDULE_DELAY": str(self.export_delay_ms),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TracingConfig:
        """What the OTEL_* variables ask for (tracing off when they ask for nothing)."""
        env = os.environ if env is None else env
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or exporter == "none"
        enabled = not disabled and (exporter == "otlp" or bool(endpoint))
        if exporter not in {"", "otlp", "none"}:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER={exporter!r}: stacx services export `otlp` (or `none`); "
                "point OTEL_EXPORTER_OTLP_ENDPOINT at a collector for anything else"
            )
        ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0") or 1.0)
        return cls(
            enabled=enabled,
            endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT,
            sample_ratio=min(max(ratio, 0.0), 1.0),
            export_delay_ms=_export_delay_ms(env),
        )


def _export_delay_ms(env: Mapping[str, str]) -> int:
    value = env.get("OTEL_BSP_SCHEDULE_DELAY", "").strip()
    if not value:
        return DEFAULT_EXPORT_DELAY_MS
    if not value.isdigit() or int(value) < 10:
        raise ValueError(f"OTEL_BSP_SCHEDULE_DELAY={value!r}: give the export delay in milliseconds (>= 10)")
    return int(value)


def _env_size(name: str, default: int) -> int:
    """A positive count from the standard variable `name` (unset or empty: `default`)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name}={value!r}: give a number of spans (>= 1)")
    return int(value)


def setup_tracing(service: str, config: TracingConfig | None = None) -> bool:
    """Install the SDK for `service` (resource `service.name`, OTEL_SERVICE_NAME wins) when tracing
    is on; True if it was installed. Idempotent within a process."""
    config = config if config is not None else TracingConfig.from_env()
    if not config.enabled or _installed:
        return bool(_installed)
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"stacx-{service}"
    provider = TracerProvider(
        resource=Resource.create({"service.name": name, "service.namespace": "stacx"}),
        sampler=sampler(config.sample_ratio),
    )
    traces_url = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or f"{config.endpoint.rstrip('/')}/v1/traces"
    )
    reader = InMemoryMetricReader()  # the processor's own counters: what `dropped_spans` reads
    processor = BatchSpanProcessor(
        _exporter(traces_url),
        schedule_delay_millis=config.export_delay_ms,
        max_export_batch_size=_env_size("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        max_queue_size=_env_size("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _processor_readers.append(reader)
    _installed.append(provider)
    atexit.register(shutdown_tracing)
    log.info(
        "tracing on: service %s exports OTLP to %s (sample ratio %.2f)", name, traces_url, config.sample_ratio
    )
    return True


def _exporter(traces_url: str) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=traces_url)


def dropped_spans() -> int:
    """Spans this process's span processor dropped so far (its queue full), from the SDK's own
    `otel.sdk.processor.span.processed` counter: counted when the standard variable
    OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED=true turns the SDK's own metrics on (0 otherwise)."""
    return sum(_dropped(reader) for reader in _processor_readers)


def _dropped(reader: InMemoryMetricReader) -> int:
    from opentelemetry.sdk.metrics.export import NumberDataPoint

    data = reader.get_metrics_data()
    if data is None:
        return 0
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == PROCESSED_SPANS
        for point in metric.data.data_points
    ]
    return sum(
        int(point.value)
        for point in points
        if isinstance(point, NumberDataPoint) and point.attributes and point.attributes.get("error.type")
    )


def sampler(ratio: float) -> Sampler:
    """Parent-based: a trace is kept or dropped whole, by its root's service. Every root is kept
    at ratio 1 (the SDK's default sampler, which skips the per-span trace-id ratio test)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    return ParentBased(ALWAYS_ON if ratio >= 1.0 else TraceIdRatioBased(ratio))


def shutdown_tracing() -> None:
    """Export what is still buffered (called at exit; safe to call twice)."""
    _processor_readers.clear()
    while _installed:
        provider = _installed.pop()
        try:
            provider.shutdown()  # type: ignore[attr-defined]
        except Exception as exc:  # a backend gone at exit must not turn a clean exit into a crash
            log.warning("tracing shutdown: %s", exc)


class MetricsConfig(BaseModel):
    """What the standard variables ask for: OTEL_METRICS_EXPORTER=prometheus (scrape endpoint on
    OTEL_EXPORTER_PROMETHEUS_HOST:PORT, default 127.0.0.1:9464) or otlp (to the OTLP endpoint)."""

    model_config = ConfigDict(extra="forbid")

    exporter: Literal["none", "prometheus", "otlp"] = "none"
    host: str = "127.0.0.1"
    port: int = 9464

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MetricsConfig:
        env = os.environ if env is None else env
        exporter = env.get("OTEL_METRICS_EXPORTER", "none").strip().lower() or "none"
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            exporter = "none"
        if exporter not in {"none", "prometheus", "otlp"}:
            raise ValueError(
                f"OTEL_METRICS_EXPORTER={exporter!r}: stacx services export `prometheus`, `otlp` or `none`"
            )
        port = env.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")
        if not port.isdigit():
            raise ValueError(f"OTEL_EXPORTER_PROMETHEUS_PORT={port!r}: give a port number")
        return cls.model_validate(
            {
                "exporter": exporter,
                "host": env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1"),
                "port": int(port),
            }
        )


def setup_metrics(service: str, config: MetricsConfig | None = None) -> str | None:
    """Install a MeterProvider for `service` when metrics are asked for; where they go, or None."""
    config = config if config is not None else MetricsConfig.from_env()
    if config.exporter == "none" or _metrics_installed:
        return None
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create(
        {
            "service.name": os.environ.get("OTEL_SERVICE_NAME") or f"stacx-{service}",
            "service.namespace": "stacx",
        }
    )
    reader: MetricReader
    if config.exporter == "prometheus":
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        start_http_server(config.port, addr=config.host)
        reader = PrometheusMetricReader()
        where = f"http://{config.host}:{config.port}/metrics"
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        where = "OTLP"
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(provider)
    _metrics_installed.append(provider)
    atexit.register(provider.shutdown)
    log.info("metrics on: service %s at %s", service, where)
    return where


_metrics_installed: list[object] = []


def setup_rank(service: str) -> None:
    """In a spawned trainer rank: tracing, and metrics on rank 0 (the one that records them)."""
    setup_tracing(service)
    if os.environ.get("RANK", "0") == "0":
        setup_metrics(service)
