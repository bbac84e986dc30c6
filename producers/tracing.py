"""W3C trace context in Kafka headers (OpenTelemetry's configured propagator, tracecontext by default).

Library code uses only the OpenTelemetry API; a service's entry point installs the SDK (see
`infra/telemetry.py`). Until it does, `tracing_on()` is False and every helper here is a no-op: no
span is made and no header is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace.status import Status, StatusCode

__all__ = [
    "SECONDS_BUCKETS",
    "TRACEPARENT",
    "ActiveSpan",
    "context_from_headers",
    "link_from_headers",
    "publish_span",
    "span",
    "trace_headers",
    "tracer_for",
    "tracing_on",
]

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                   600.0)
"""Bucket bounds of every histogram in seconds (`explicit_bucket_boundaries_advisory`): the OTel
SDK's defaults (0 to 10,000) are meant for milliseconds and put every duration of ours in two
buckets."""

TRACEPARENT = "traceparent"


_NOT_RECORDING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def tracing_on() -> bool:
    """True once a service installed a recording TracerProvider (the SDK's)."""
    return not isinstance(trace.get_tracer_provider(), _NOT_RECORDING)


def tracer_for(name: str) -> trace.Tracer | None:
    """The installed provider's tracer `name` (made once per provider); None while tracing is off."""
    provider = trace.get_tracer_provider()
    known = _TRACERS.get(name)
    if known is not None and known[0] is provider:
        return known[1]
    tracer = None if isinstance(provider, _NOT_RECORDING) else provider.get_tracer(name)
    _TRACERS[name] = (provider, tracer)
    return tracer


_TRACERS: dict[str, tuple[trace.TracerProvider, trace.Tracer | None]] = {}
"""Each tracer name's provider when last asked, and its tracer: the SDK's `get_tracer` builds two
scope objects and resets the warnings filters on every call, and `isinstance` against the API's
abstract provider classes is a tenth of a span's cost on hot paths."""


def trace_headers() -> list[tuple[str, bytes]]:
    """Headers (`traceparent`, `tracestate`, `baggage`) carrying the current context; [] if none."""
    if not trace.get_current_span().get_span_context().is_valid:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(k, v.encode()) for k, v in carrier.items()]


_NO_SPAN: AbstractContextManager[None] = nullcontext()
"""What `span` and `publish_span` give while tracing is off: nothing to make, nothing to end."""


class ActiveSpan:
    """A started span made current for a `with` block, then ended: `trace.use_span(span,
    end_on_exit=True)` without its two generator context managers, a third of a span's cost on the
    event loop. An `Exception` leaving the block is recorded on the span and sets its status to
    ERROR, as `use_span` does."""

    __slots__ = ("span", "_token")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self._token: object = None

    def __enter__(self) -> trace.Span:
        self._token = context_api.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        context_api.detach(self._token)  # type: ignore[arg-type]
        if isinstance(exc, Exception) and self.span.is_recording():
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.span.end()


def publish_span(topic: str, record_id: str = "") -> AbstractContextManager[object]:
    """A PRODUCER span `publish <topic>` (child of the current span, else a new trace) while an
    event is handed to Kafka, so that every event carries a trace context when tracing is on.
    Nothing at all when tracing is off."""
    tracer = tracer_for("stacx.producers")
    if tracer is None:
        return _NO_SPAN
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "publish",
        "messaging.destination.name": topic,
    }
    if record_id:
        attributes["stacx.record_id"] = record_id
    return ActiveSpan(
        tracer.start_span(f"publish {topic}", kind=trace.SpanKind.PRODUCER, attributes=attributes)
    )


def span(
    tracer: str,
    name: str,
    *,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    context: Context | None = None,
    links: Sequence[trace.Link] | None = None,
) -> AbstractContextManager[trace.Span | None]:
    """A span current for a `with` block when tracing is on (the block gets the span), nothing at
    all when it is off (the block gets None): hot paths pay one check."""
    source = tracer_for(tracer)
    if source is None:
        return _NO_SPAN
    return ActiveSpan(source.start_span(name, context=context, kind=kind, attributes=attributes, links=links))


def context_from_headers(headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None) -> Context:
    """The OpenTelemetry context carried by Kafka headers (empty context if none)."""
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    carrier = {k: v.decode("utf-8", "replace") for k, v in items if v is not None}
    return propagate.extract(carrier)


def link_from_headers(
    headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None, **attributes: Any
) -> trace.Link | None:
    """A span link to the span whose context the headers carry (None when they carry none)."""
    context = trace.get_current_span(context_from_headers(headers)).get_span_context()
    if not context.is_valid:
        return None
    return trace.Link(context, attributes or None)
