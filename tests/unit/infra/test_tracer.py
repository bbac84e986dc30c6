"""The short span path of `FastTracerProvider` gives the spans the SDK's own path gives."""

from __future__ import annotations

import pytest
from opentelemetry import propagate, trace
from opentelemetry.context import Context, attach, detach
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from tracing_fixtures import in_memory_tracing

from infra import tracer as tracer_module
from infra.telemetry import sampler
from infra.tracer import FastTracerProvider

REMOTE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}"


def _episode(tracer: trace.Tracer) -> dict[str, str]:
    """A root with attributes, a CLIENT child linked to a remote span, a child of a remote parent
    carrying tracestate; returns the child's outgoing headers."""
    remote = propagate.extract({"traceparent": REMOTE.format(flags="01"), "tracestate": "vendor=1"})
    link = trace.Link(trace.get_current_span(remote).get_span_context(), {"why": "batch"})
    headers: dict[str, str] = {}
    with tracer.start_as_current_span(
        "episode", attributes={"stacx.task_id": "t-1", "stacx.sample_index": 3, "stacx.tags": ("a", "b")}
    ):
        with tracer.start_as_current_span("generate", kind=trace.SpanKind.CLIENT, links=[link]) as child:
            child.set_attribute("gen_ai.usage.output_tokens", 7)
            child.set_attributes(
                {"gen_ai.response.finish_reasons": ["stop"], "stacx.dropped": None}
            )  # cleaned
            child.set_attributes(
                {"gen_ai.usage.input_tokens": 12, "stacx.sample_index": 4}
            )  # plain, replaces
            child.set_attribute("gen_ai.usage.output_tokens", 8)  # set again: moves to the end
            child.set_attributes({"stacx.reasons": ["stop", "length"], "stacx.empty": []})  # kept as tuples
            propagate.inject(headers)
    with tracer.start_as_current_span("gateway.exec", context=remote, kind=trace.SpanKind.SERVER):
        pass
    return headers


def _shape(spans: tuple[ReadableSpan, ...]) -> list[tuple[object, ...]]:
    """What a trace backend sees of each span, ids made relative (they are random)."""
    ids = {s.context.span_id: s.name for s in spans}
    return [
        (
            s.name,
            s.kind,
            ids.get(s.parent.span_id, "remote") if s.parent else None,
            s.parent.is_remote if s.parent else None,
            int(s.context.trace_flags),
            s.context.trace_state.to_header(),
            list((s.attributes or {}).items()),  # in order
            [(hex(link.context.span_id), dict(link.attributes or {})) for link in s.links],
            s.status.status_code,
            s.resource.attributes.get("service.name"),
            s.instrumentation_scope.name if s.instrumentation_scope else None,
        )
        for s in spans
    ]


def test_the_short_path_makes_the_spans_the_sdk_makes() -> None:
    shapes = []
    for provider_type in (TracerProvider, FastTracerProvider):
        with in_memory_tracing(provider_type(sampler=sampler(1.0))) as exporter:
            headers = _episode(trace.get_tracer("stacx.test"))
        spans = exporter.get_finished_spans()
        shapes.append(_shape(spans))
        (episode,) = (s for s in spans if s.name == "episode")
        (generate,) = (s for s in spans if s.name == "generate")
        assert headers["traceparent"].split("-")[1] == f"{episode.context.trace_id:032x}"
        assert headers["traceparent"].split("-")[2] == f"{generate.context.span_id:016x}"
        (gateway,) = (s for s in spans if s.name == "gateway.exec")
        assert gateway.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert shapes[0] == shapes[1]


def test_an_unsampled_parent_makes_an_unrecorded_child_as_in_the_sdk() -> None:
    with in_memory_tracing(FastTracerProvider(sampler=sampler(1.0))) as exporter:
        unsampled = propagate.extract({"traceparent": REMOTE.format(flags="00")})
        with trace.get_tracer("stacx.test").start_as_current_span("child", context=unsampled) as child:
            assert not child.is_recording()
            assert child.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert exporter.get_finished_spans() == ()


def test_a_ratio_sampler_keeps_the_sdks_decisions() -> None:
    with in_memory_tracing(FastTracerProvider(sampler=sampler(0.0))) as exporter:
        with trace.get_tracer("stacx.test").start_as_current_span("root") as root:
            assert not root.is_recording()
    assert exporter.get_finished_spans() == ()


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        self.spans.extend(spans)  # type: ignore[call-overload]
        return SpanExportResult.SUCCESS


def test_a_finished_span_reaches_the_processors_as_itself_and_refuses_changes() -> None:
    provider = FastTracerProvider(sampler=sampler(1.0))
    kept = _Keep()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    span = provider.get_tracer("stacx.test").start_span("step", attributes={"stacx.step": 1})
    span.end()
    assert kept.spans == [span]
    span.set_attribute("stacx.step", 2)  # an ended span: ignored (the SDK logs a warning)
    assert kept.spans[0].attributes == {"stacx.step": 1}


def test_each_root_starts_its_own_trace() -> None:
    with in_memory_tracing(FastTracerProvider(sampler=sampler(1.0))) as exporter:
        for _ in range(3):
            with trace.get_tracer("stacx.test").start_as_current_span("episode"):
                pass
    assert len({s.context.trace_id for s in exporter.get_finished_spans()}) == 3


class _OtherArguments:
    """A `_Span` of an SDK release that takes other constructor arguments."""

    def __init__(self, **kwargs: object) -> None:
        raise TypeError("unexpected keyword argument 'instrumentation_info'")


def test_an_sdk_whose_span_constructor_moved_gets_its_own_path(monkeypatch: pytest.MonkeyPatch) -> None:
    with in_memory_tracing(TracerProvider(sampler=sampler(1.0))) as exporter:
        _episode(trace.get_tracer("stacx.test"))
    expected = _shape(exporter.get_finished_spans())
    monkeypatch.setattr(tracer_module, "_FinishedAsIs", _OtherArguments)
    with in_memory_tracing(FastTracerProvider(sampler=sampler(1.0))) as exporter:
        _episode(trace.get_tracer("stacx.test"))
    assert _shape(exporter.get_finished_spans()) == expected


def test_a_sampler_without_the_known_delegates_is_not_taken_for_always_on() -> None:
    moved = sampler(1.0)
    del moved._root  # type: ignore[attr-defined]
    assert tracer_module._always_on(sampler(1.0)) and not tracer_module._always_on(moved)
    assert not tracer_module._always_on(sampler(0.5))


def _state(span: object) -> dict[str, object]:
    """A span's state, its per-span containers by content (locks by type)."""
    state = dict(vars(span))
    state["_lock"] = type(state["_lock"])
    state["_attributes"] = (type(state["_attributes"]), list(state["_attributes"].items()))
    for name in ("_events", "_links"):  # the short path's span shares one empty list until it adds one
        state[name] = (list(state[name]), state[name].dropped)
    return state


def test_a_span_of_the_short_path_holds_what_the_sdks_constructor_gives_it() -> None:
    provider = FastTracerProvider(sampler=sampler(1.0))
    tracer = provider.get_tracer("stacx.test")
    remote = propagate.extract({"traceparent": REMOTE.format(flags="01")})
    link = trace.Link(trace.get_current_span(remote).get_span_context(), {"why": "batch"})
    attributes = {"stacx.task_id": "t-1", "list": ["a"]}
    span = tracer.start_span("step", remote, trace.SpanKind.CLIENT, attributes, [link], start_time=5)
    made = tracer_module._FinishedAsIs(
        name="step",
        context=span.get_span_context(),
        parent=trace.get_current_span(remote).get_span_context(),
        sampler=tracer.sampler,  # type: ignore[attr-defined]
        resource=tracer.resource,  # type: ignore[attr-defined]
        attributes=attributes,
        span_processor=tracer.span_processor,  # type: ignore[attr-defined]
        kind=trace.SpanKind.CLIENT,
        links=[link],
        instrumentation_info=tracer.instrumentation_info,  # type: ignore[attr-defined]
        limits=tracer._span_limits,  # type: ignore[attr-defined]
        instrumentation_scope=tracer._instrumentation_scope,  # type: ignore[attr-defined]
    )
    made.start(start_time=5)
    assert type(span) is tracer_module._FinishedAsIs
    assert _state(span) == _state(made)


def test_an_sdk_whose_spans_hold_more_gets_its_own_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release whose span constructor sets a field the short path does not know of."""
    with in_memory_tracing(TracerProvider(sampler=sampler(1.0))) as exporter:
        _episode(trace.get_tracer("stacx.test"))
    expected = _shape(exporter.get_finished_spans())
    constructor = sdk_trace.Span.__init__

    def more(self: sdk_trace.Span, *args: object, **kwargs: object) -> None:
        constructor(self, *args, **kwargs)  # type: ignore[arg-type]
        self._new_in_this_release = True  # type: ignore[attr-defined]

    monkeypatch.setattr(sdk_trace.Span, "__init__", more)
    with in_memory_tracing(FastTracerProvider(sampler=sampler(1.0))) as exporter:
        _episode(trace.get_tracer("stacx.test"))
    spans = exporter.get_finished_spans()
    assert _shape(spans) == expected
    assert not any(isinstance(s, tracer_module._FinishedAsIs) for s in spans)  # the SDK made them


def test_events_and_links_added_later_go_to_each_spans_own_list() -> None:
    provider = FastTracerProvider(sampler=sampler(1.0))
    kept = _Keep()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    tracer = provider.get_tracer("stacx.test")
    remote = trace.get_current_span(propagate.extract({"traceparent": REMOTE.format(flags="01")}))
    first, second, third = (tracer.start_span(name) for name in ("first", "second", "third"))
    first.add_event("started", {"n": 1})
    first.record_exception(ValueError("boom"))
    second.add_link(remote.get_span_context(), {"why": "batch"})
    for span in (first, second, third):
        span.end()
    first.add_event("too late")  # an ended span: ignored, as in the SDK
    events = {s.name: [e.name for e in s.events] for s in kept.spans}
    links = {s.name: [link.context.span_id for link in s.links] for s in kept.spans}
    assert events == {"first": ["started", "exception"], "second": [], "third": []}
    assert links == {"first": [], "second": [0xB7AD6B7169203331], "third": []}


def test_a_lone_processor_gets_spans_directly_and_one_added_later_gets_them_too() -> None:
    provider = FastTracerProvider(sampler=sampler(1.0))
    first, second = _Keep(), _Keep()
    lone = SimpleSpanProcessor(first)
    provider.add_span_processor(lone)
    tracer = provider.get_tracer("stacx.test")
    span = tracer.start_span("before")
    span.end()
    assert span._span_processor is lone  # type: ignore[attr-defined]  # no multi-processor loop
    provider.add_span_processor(SimpleSpanProcessor(second))
    tracer.start_span("after").end()
    assert [s.name for s in first.spans] == ["before", "after"]
    assert [s.name for s in second.spans] == ["after"]


class _OwnSpan(trace.NonRecordingSpan):
    """A `Span` class of some other library, met in a context."""


@pytest.mark.parametrize(
    "value",
    [
        None,
        "not a span",
        trace.INVALID_SPAN,
        trace.NonRecordingSpan(trace.SpanContext(1, 2, is_remote=True)),
        _OwnSpan(trace.SpanContext(3, 4, is_remote=False)),
    ],
)
def test_the_current_span_context_is_the_apis(value: object) -> None:
    context = Context({tracer_module._SPAN_KEY: value}) if value is not None else Context()
    expected = trace.get_current_span(context).get_span_context()
    for _ in range(2):  # the second time, the span's class is known
        assert tracer_module.current_span_context(context) == expected
    token = attach(context)
    try:
        assert tracer_module.current_span_context() == expected
    finally:
        detach(token)
    assert str not in tracer_module._SPAN_TYPES
