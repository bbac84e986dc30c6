"""`setup_tracing` installs the plain OpenTelemetry SDK: its TracerProvider, its BatchSpanProcessor
with the OTLP/HTTP exporter and the standard queue variables; spans the processor drops are counted
from the SDK's own processor counter."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from stacx.infra import telemetry
from stacx.infra.telemetry import TracingConfig


class _Blocked(SpanExporter):
    """Holds every export until released: the processor's queue fills behind it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.names: list[str] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        self.names += [span.name for span in spans]
        return SpanExportResult.SUCCESS


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BatchSpanProcessor]]:
    """setup_tracing with the SDK's global provider swapped back afterwards; yields its processors."""
    added: list[BatchSpanProcessor] = []
    original = TracerProvider.add_span_processor

    def add(self: TracerProvider, processor: BatchSpanProcessor) -> None:
        added.append(processor)
        original(self, processor)

    monkeypatch.setattr(TracerProvider, "add_span_processor", add)
    monkeypatch.setattr(trace, "set_tracer_provider", lambda provider: None)
    yield added
    telemetry.shutdown_tracing()


def test_the_service_provider_is_the_sdks_with_its_batch_processor_and_otlp_exporter(
    installed: list[BatchSpanProcessor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "stacx-unit")
    assert telemetry.setup_tracing("unit", TracingConfig(enabled=True, endpoint="http://127.0.0.1:9"))
    (provider,) = telemetry._installed
    assert type(provider) is TracerProvider
    assert provider.resource.attributes["service.name"] == "stacx-unit"  # type: ignore[attr-defined]
    (processor,) = installed
    assert type(processor) is BatchSpanProcessor
    assert isinstance(processor.span_exporter, OTLPSpanExporter)
    assert processor.span_exporter._endpoint == "http://127.0.0.1:9/v1/traces"  # type: ignore[attr-defined]
    assert telemetry.setup_tracing("unit", TracingConfig(enabled=True))  # idempotent
    assert len(telemetry._installed) == 1


def test_context_travels_with_the_sdks_default_w3c_propagators() -> None:
    fields = propagate.get_global_textmap().fields
    assert {"traceparent", "tracestate", "baggage"} <= set(fields)


def test_spans_the_full_queue_drops_are_counted_from_the_sdks_processor_counter(
    installed: list[BatchSpanProcessor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "2")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
    blocked = _Blocked()
    monkeypatch.setattr(telemetry, "_exporter", lambda url: blocked)
    assert telemetry.setup_tracing("unit", TracingConfig(enabled=True, export_delay_ms=10))
    (provider,) = telemetry._installed
    tracer = provider.get_tracer("stacx.test")  # type: ignore[attr-defined]
    for index in range(12):
        tracer.start_span(f"s{index}").end()
    assert telemetry.dropped_spans() >= 12 - 2 - 1  # the queue holds 2, the blocked export 1
    blocked.release.set()
    installed[0].force_flush()
    assert 1 <= len(blocked.names) <= 3 and "s11" in blocked.names  # a full queue keeps the newest


def test_the_standard_queue_variables_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    with pytest.raises(ValueError, match="^OTEL_BSP_MAX_QUEUE_SIZE='lots': give a number of spans"):
        telemetry.setup_tracing("test", TracingConfig(enabled=True))
    assert not telemetry._installed and telemetry.dropped_spans() == 0
