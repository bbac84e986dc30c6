"""The short W3C propagator writes and reads what OpenTelemetry's default composite propagator does."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage import _BAGGAGE_KEY
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from infra.propagator import W3CPropagator, install_propagator

SDK = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
TRACE, SPAN = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
ID = "0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"


def _context(
    flags: int = 1, state: str = "", bag: dict[str, str] | None = None, remote: bool = False
) -> Context:
    span_context = trace.SpanContext(
        TRACE,
        SPAN,
        is_remote=remote,
        trace_flags=trace.TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else None,
    )
    context = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
    for key, value in (bag or {}).items():
        context = baggage.set_baggage(key, value, context)
    return context


INJECTED = [
    Context(),
    _context(),
    _context(flags=0),
    _context(state="vendor=1,other=two"),
    _context(bag={"user": "a b", "tenant": "x"}),
    _context(state="v=1", bag={"k": "v"}, remote=True),
    baggage.set_baggage("only", "baggage", Context()),
    trace.set_span_in_context(trace.INVALID_SPAN, Context()),
]


@pytest.mark.parametrize("context", INJECTED)
def test_inject_writes_the_composites_headers(context: Context) -> None:
    ours: dict[str, str] = {}
    theirs: dict[str, str] = {}
    W3CPropagator().inject(ours, context)
    SDK.inject(theirs, context)
    assert ours == theirs


def test_inject_reads_the_current_context_and_each_span_gets_its_own_header() -> None:
    propagator = W3CPropagator()
    for flags in (1, 0, 1):
        context = _context(flags=flags)
        ours: dict[str, str] = {}
        from opentelemetry import context as context_api

        token = context_api.attach(context)
        try:
            propagator.inject(ours)
        finally:
            context_api.detach(token)
        assert ours == {"traceparent": f"00-{ID}-{flags:02x}"}


CARRIERS: list[dict[str, Any]] = [
    {},
    {"traceparent": f"00-{ID}-01"},
    {"traceparent": f"00-{ID}-00"},
    {"traceparent": f"00-{ID}-01", "tracestate": "vendor=1"},
    {"traceparent": f"00-{ID}-01", "baggage": "user=a%20b,tenant=x"},
    {"traceparent": f"00-{ID}-01", "baggage": ""},
    {"traceparent": f"00-{ID.upper()}-01"},
    {"traceparent": f" 00-{ID}-01 "},
    {"traceparent": f"01-{ID}-01-extra"},
    {"traceparent": f"00-{ID}-01-extra"},
    {"traceparent": f"ff-{ID}-01"},
    {"traceparent": f"00-{'0' * 32}-b7ad6b7169203331-01"},
    {"traceparent": f"00-0af7651916cd43dd8448eb211c80319c-{'0' * 16}-01"},
    {"traceparent": [f"00-{ID}-01", f"00-{ID}-00"]},
    {"traceparent": "garbage"},
    {"baggage": "k=v"},
]


def _seen(context: Context) -> tuple[object, ...]:
    span_context = trace.get_current_span(context).get_span_context()
    return (
        sorted(context),
        span_context,
        span_context.trace_state.to_header(),
        dict(baggage.get_all(context)),
    )


@pytest.mark.parametrize("carrier", CARRIERS)
@pytest.mark.parametrize("base", [None, baggage.set_baggage("mine", "1", Context())])
def test_extract_reads_what_the_composite_reads(carrier: dict[str, Any], base: Context | None) -> None:
    assert _seen(W3CPropagator().extract(carrier, base)) == _seen(SDK.extract(carrier, base))


def test_a_custom_getter_is_left_to_the_composite() -> None:
    class Upper(DefaultGetter):
        def get(self, carrier: Any, key: str) -> list[str] | None:
            return super().get(carrier, key.upper())

    carrier = {"TRACEPARENT": f"00-{ID}-01"}
    context = W3CPropagator().extract(carrier, getter=Upper())
    assert trace.get_current_span(context).get_span_context().span_id == SPAN
    assert W3CPropagator().fields == SDK.fields


@pytest.mark.parametrize(
    ("env", "installed"),
    [
        ({}, True),
        ({"OTEL_PROPAGATORS": ""}, True),
        ({"OTEL_PROPAGATORS": "tracecontext, baggage"}, True),
        ({"OTEL_PROPAGATORS": "tracecontext"}, False),
        ({"OTEL_PROPAGATORS": "b3,tracecontext,baggage"}, False),
        ({"OTEL_PROPAGATORS": "none"}, False),
    ],
)
def test_it_becomes_the_global_propagator_only_where_the_default_is_asked_for(
    env: dict[str, str], installed: bool
) -> None:
    saved = propagate.get_global_textmap()
    try:
        propagate.set_global_textmap(
            CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
        )
        assert install_propagator(env) is installed
        assert isinstance(propagate.get_global_textmap(), W3CPropagator) is installed
        assert install_propagator(env) is False  # already installed, or another one is
    finally:
        propagate.set_global_textmap(saved)


def test_baggage_that_is_not_a_mapping_writes_what_the_composite_writes() -> None:
    for value in ("not a dict", {}, {"k": "v"}):
        context = Context({_BAGGAGE_KEY: value})
        ours: dict[str, str] = {}
        theirs: dict[str, str] = {}
        W3CPropagator().inject(ours, context)
        SDK.inject(theirs, context)
        assert ours == theirs
