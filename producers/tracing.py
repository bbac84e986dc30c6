"""W3C trace context in Kafka headers (OpenTelemetry's configured propagator, tracecontext by default)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context

__all__ = ["context_from_headers", "trace_headers"]


def trace_headers() -> list[tuple[str, bytes]]:
    """Headers (`traceparent`, `tracestate`, `baggage`) carrying the current context; [] if none."""
    if not trace.get_current_span().get_span_context().is_valid:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(k, v.encode()) for k, v in carrier.items()]


def context_from_headers(headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None) -> Context:
    """The OpenTelemetry context carried by Kafka headers (empty context if none)."""
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    carrier = {k: v.decode("utf-8", "replace") for k, v in items if v is not None}
    return propagate.extract(carrier)
