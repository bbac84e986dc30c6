"""The span processor and exporter of every service, read by the real trace backend: spans exported
to the local Jaeger (`stacx infra up`) come back from its query API with their parents, links, attributes,
events and statuses. Fails, never skips, when Jaeger is missing."""

from __future__ import annotations

import time
import uuid

import pytest
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from tracing_fixtures import running_jaeger

from stacx.infra.services.jaeger import JaegerConfig
from stacx.infra.telemetry import sampler
from stacx.infra.traces import Trace, fetch_trace

LINKED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def jaeger() -> JaegerConfig:
    return running_jaeger()


def _exported(jaeger: JaegerConfig, trace_id: str, count: int) -> Trace:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = fetch_trace(jaeger.query_url, trace_id)
        if found is not None and len(found.spans) >= count:
            return found
        time.sleep(0.5)
    raise AssertionError(f"trace {trace_id} did not reach Jaeger with {count} spans")


def test_jaeger_reads_the_spans_the_exporter_encodes(jaeger: JaegerConfig) -> None:
    service = f"stacx-otlp-test-{uuid.uuid4().hex[:8]}"
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=sampler(1.0))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{jaeger.otlp_http_endpoint}/v1/traces"))
    )
    tracer = provider.get_tracer("stacx.test")
    link = trace.Link(trace.get_current_span(propagate.extract({"traceparent": LINKED})).get_span_context())
    with tracer.start_as_current_span("rollout.episode", attributes={"stacx.task_id": "t-1", "n": 3}) as root:
        with tracer.start_as_current_span("text_completion tiny", kind=trace.SpanKind.CLIENT, links=[link]):
            pass
        try:
            with tracer.start_as_current_span("sandbox.exec", attributes={"ratio": 0.5, "ok": False}):
                raise RuntimeError("exit 3")
        except RuntimeError:
            pass
    provider.force_flush()
    trace_id = f"{root.get_span_context().trace_id:032x}"
    found = _exported(jaeger, trace_id, 3)
    provider.shutdown()
    (episode,) = found.named("rollout.episode")
    (generate,) = found.named("text_completion tiny")
    (step,) = found.named("sandbox.exec")
    assert {s.service for s in found.spans} == {service}
    assert generate.parent_id == episode.span_id == step.parent_id
    assert generate.links == [("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")]
    assert episode.attributes["stacx.task_id"] == "t-1" and episode.attributes["n"] == 3
    assert step.attributes["ratio"] == 0.5 and step.attributes["ok"] is False
    assert step.attributes["otel.status_code"] == "ERROR"
    assert generate.attributes["span.kind"] == "client"
