"""The span exporter's own protobuf encoder writes the bytes the SDK's encoder writes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from tracing_fixtures import in_memory_tracing

from infra.otlp import FastOTLPSpanExporter, encode_spans
from infra.telemetry import sampler
from infra.tracer import FastTracerProvider


def sdk_encoding(spans: Sequence[ReadableSpan]) -> bytes:
    """The SDK's bytes for `spans` (what `encode_spans` must equal)."""
    return bytes(sdk_encode_spans(spans).SerializeToString())


REMOTE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SCALARS: dict[str, Any] = {
    "text": "naïve ☃",
    "empty": "",
    "yes": True,
    "no": False,
    "zero": 0,
    "small": 7,
    "big": 2**40 + 3,
    "negative": -5,
    "int64.min": -(2**63),
    "int64.max": 2**63 - 1,
    "real": 0.25,
    "negative.zero": -0.0,
    "strings": ["stop", "length"],
    "ints": [1, -2, 300],
    "floats": [1.5],
    "bools": [True, False],
    "with.none": ["a", None],
    "empty.list": [],
}


def _spans(provider: TracerProvider) -> tuple[ReadableSpan, ...]:
    """Spans with every field the services emit: roots and children, a remote parent with
    tracestate, links with attributes, every attribute type, an exception event, error statuses,
    two scopes (one with a version and a schema url)."""
    with in_memory_tracing(provider) as exporter:
        plain = trace.get_tracer("stacx.test")
        versioned = trace.get_tracer(
            "stacx.other", "1.2", schema_url="https://opentelemetry.io/schemas/1.21.0"
        )
        remote = propagate.extract({"traceparent": REMOTE, "tracestate": "vendor=1,other=two"})
        link = trace.Link(trace.get_current_span(remote).get_span_context(), {"why": "batch", "n": 2})
        with plain.start_as_current_span("rollout.episode", attributes=SCALARS):
            with versioned.start_as_current_span(
                "text_completion tiny", kind=trace.SpanKind.CLIENT, links=[link]
            ):
                pass
            try:
                with plain.start_as_current_span("sandbox.exec", kind=trace.SpanKind.CLIENT):
                    raise ValueError("boom")
            except ValueError:
                pass
            with plain.start_as_current_span("publish t", kind=trace.SpanKind.PRODUCER) as sp:
                sp.set_status(trace.Status(trace.StatusCode.OK))
        with plain.start_as_current_span("gateway.exec", context=remote, kind=trace.SpanKind.SERVER):
            pass
        with versioned.start_as_current_span("consume", kind=trace.SpanKind.CONSUMER) as sp:
            sp.set_status(trace.StatusCode.ERROR)
        with plain.start_as_current_span(""):
            pass
    return exporter.get_finished_spans()


def test_the_bytes_are_the_sdks_for_spans_of_both_span_paths() -> None:
    for provider_type in (TracerProvider, FastTracerProvider):
        spans = _spans(provider_type(sampler=sampler(1.0)))
        assert len(spans) == 7
        assert encode_spans(spans) == sdk_encoding(spans)


def test_the_official_classes_read_back_every_span_its_parent_and_its_link() -> None:
    spans = _spans(FastTracerProvider(sampler=sampler(1.0)))
    request = ExportTraceServiceRequest.FromString(encode_spans(spans))
    decoded = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    by_name = {s.name: s for s in decoded}
    assert sorted(by_name) == sorted(s.name for s in spans)
    episode, generate = by_name["rollout.episode"], by_name["text_completion tiny"]
    assert generate.parent_span_id == episode.span_id and generate.trace_id == episode.trace_id
    assert generate.links[0].span_id == bytes.fromhex("b7ad6b7169203331")
    assert {kv.key: kv.value.string_value for kv in generate.links[0].attributes}["why"] == "batch"
    assert by_name["gateway.exec"].trace_state == "vendor=1,other=two"
    assert by_name["gateway.exec"].flags == 0x300  # a remote parent
    assert by_name["sandbox.exec"].events[0].name == "exception"
    values = {kv.key: kv.value for kv in episode.attributes}
    assert values["int64.min"].int_value == -(2**63) and values["text"].string_value == "naïve ☃"


def test_spans_of_two_services_and_equal_resources_are_grouped_as_the_sdk_groups_them() -> None:
    first = _spans(FastTracerProvider(resource=Resource.create({"service.name": "a"})))
    second = _spans(FastTracerProvider(resource=Resource.create({"service.name": "b"})))
    twin = _spans(FastTracerProvider(resource=Resource.create({"service.name": "a"})))  # equal, not the same
    mixed = [x for trio in zip(first, second, twin, strict=True) for x in trio]
    assert encode_spans(mixed) == sdk_encoding(mixed)
    assert len(ExportTraceServiceRequest.FromString(encode_spans(mixed)).resource_spans) == 2


class _Sent:
    """The exporter's HTTP client, recording what it is given."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def export(self, body: bytes, *args: Any, **kwargs: Any) -> Any:
        self.bodies.append(bytes(body))
        return type("Outcome", (), {"success": True, "status_code": 200, "error": None})()


def _sent(spans: Sequence[ReadableSpan]) -> bytes:
    exporter = FastOTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    client = exporter._client = _Sent()  # type: ignore[assignment]
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    (body,) = client.bodies
    return body


def test_the_exporter_sends_the_sdks_bytes() -> None:
    spans = _spans(FastTracerProvider(sampler=sampler(1.0)))
    assert _sent(spans) == sdk_encoding(spans)


def test_what_only_the_sdks_encoder_writes_is_left_to_it() -> None:
    """An integer beyond 64 bits: the SDK's encoder drops that attribute (and logs it)."""
    provider = FastTracerProvider(sampler=sampler(1.0))
    with in_memory_tracing(provider) as exporter:
        with trace.get_tracer("stacx.test").start_as_current_span("s", attributes={"huge": 2**70, "ok": 1}):
            pass
    spans = exporter.get_finished_spans()
    body = _sent(spans)
    assert body == sdk_encoding(spans)
    (span,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    assert [kv.key for kv in span.attributes] == ["ok"]


def _transport(exporter: FastOTLPSpanExporter) -> str:
    return type(exporter._client._transport).__name__


def test_the_local_receiver_is_posted_to_through_urllib3_unless_requests_could_send_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    local = "http://127.0.0.1:4318/v1/traces"
    assert _transport(FastOTLPSpanExporter(endpoint=local)) == "Urllib3HTTPTransport"
    assert _transport(FastOTLPSpanExporter(endpoint="http://localhost:4318/v1/traces", timeout=5)) == (
        "Urllib3HTTPTransport"
    )
    assert (
        _transport(FastOTLPSpanExporter(endpoint="http://collector:4318/v1/traces"))
        == "RequestsHTTPTransport"
    )
    assert (
        _transport(FastOTLPSpanExporter(endpoint="https://127.0.0.1:4318/v1/traces"))
        == "RequestsHTTPTransport"
    )
    assert (
        _transport(FastOTLPSpanExporter(endpoint=local, session=requests.Session()))
        == "RequestsHTTPTransport"
    )
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert _transport(FastOTLPSpanExporter(endpoint=local)) == "RequestsHTTPTransport"
    monkeypatch.delenv("HTTP_PROXY")
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login a password b\n")
    assert _transport(FastOTLPSpanExporter(endpoint=local)) == "RequestsHTTPTransport"
