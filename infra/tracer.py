"""The SDK's TracerProvider with a shorter path from `start_span` to the export queue.

Measured inside the rollout process on the 2-core machine, the SDK spent ~75 µs to start a span
and ~30 µs to end it (a tenth of that in a tight loop: hot paths run it with cold caches), most of
it in machinery that decides nothing for STACX's sampler. With every root kept (`sampler(1.0)`:
parent-based, always on), the decision is the parent's: a sampled parent gives a sampled child, no
parent gives a new sampled trace. `FastTracerProvider` makes such spans without the sampler call,
its result objects and the tracer's no-op metrics, and without the span constructor's four
`__init__` levels: a tracer copies the state the constructor gave one span (made once) and fills
in the per-span fields. Plain attributes (strings, booleans, numbers) skip the SDK's per-value
cleaning, and a finished span goes to the span processors as itself (the SDK copies it into a
`ReadableSpan` that shares its attributes, events and links anyway; an ended span refuses
changes), straight to the provider's span processor when it has only one (no loop through the
SDK's multi-processor). The current span's context is read with a type check against the span
classes already met rather than `isinstance` against the API's abstract `Span`
(`current_span_context`, also used by the propagator). Anything else (a ratio sampler, an
unsampled parent, a disabled tracer, the SDK's own metrics turned on) takes the SDK's path
unchanged, and so does every span when an SDK release has moved the internals the short path uses
(`_Span`'s constructor and the fields it sets, `ParentBased`'s delegates, `BoundedAttributes`):
the tests compare both paths' spans.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from time import time_ns

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context, get_current
from opentelemetry.sdk.trace import (
    Event,
    ReadableSpan,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    Tracer,
    TracerProvider,
    _Span,
)
from opentelemetry.sdk.trace._tracer_metrics import NoOpTracerMetrics
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanKind, TraceFlags
from opentelemetry.trace.propagation import _SPAN_KEY
from opentelemetry.util import types

__all__ = ["FastTracerProvider", "current_span_context"]

_SCALARS = (str, bool, int, float)


class _NoneYet(BoundedList):
    """The events or links of a span that has none yet: one shared empty list, which a span
    replaces by its own before its first event or link (and which refuses additions)."""

    def __init__(self) -> None:
        super().__init__(0)

    def append(self, item: object) -> None:
        raise RuntimeError("a span added to the shared empty list instead of its own")

    def extend(self, seq: object) -> None:
        raise RuntimeError("a span added to the shared empty list instead of its own")


_NONE_YET = _NoneYet()


class _FinishedAsIs(_Span):
    """An SDK span handed to the span processors as itself when it ends, whose plain attributes
    (strings, booleans and numbers within the limits) skip the SDK's per-value cleaning, and whose
    events and links lists are made at the first event or link."""

    def _readable_span(self) -> ReadableSpan:
        return self

    def get_span_context(self) -> trace_api.SpanContext:
        return self._context  # type: ignore[return-value]  # the SDK's, without its `typing.cast` call

    def _add_event(self, event: Event) -> None:
        with self._lock:
            if self._events is _NONE_YET:
                self._events = BoundedList(self._limits.max_events)
        super()._add_event(event)

    def _add_link(self, link: trace_api.Link) -> None:
        with self._lock:
            if self._links is _NONE_YET:
                self._links = BoundedList(self._limits.max_links)
        super()._add_link(link)

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if not self._set_plain(attributes):
            super().set_attributes(attributes)

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        if not self._set_plain({key: value}):
            super().set_attribute(key, value)

    def _set_plain(self, attributes: Mapping[str, types.AnyValue]) -> bool:
        """Set plain values as the SDK would (a key set again moves to the end); False: the
        SDK's path must (other values, no room, an ended span and its warning)."""
        bounded = self._attributes
        plain = _plain(bounded, attributes) if type(bounded) is BoundedAttributes else None
        if plain is None:
            return False
        with self._lock:
            values = getattr(bounded, "_dict", None)
            if self._end_time is not None or getattr(bounded, "_immutable", True) or type(values) is not dict:
                return False
            for key in plain:
                values.pop(key, None)
            values.update(plain)
        return True


def _plain(
    bounded: BoundedAttributes, attributes: Mapping[str, types.AnyValue]
) -> Mapping[str, types.AnyValue] | None:
    """The values as the SDK's cleaning would leave them, when that is all it would do: strings,
    booleans and numbers as they are, lists and tuples of strings as tuples, and room for all
    of them (None: the SDK's path must clean them)."""
    if bounded.max_value_len is not None:
        return None
    if bounded.maxlen is not None and len(bounded) + len(attributes) > bounded.maxlen:
        return None
    plain = attributes
    for key, value in attributes.items():
        if type(key) is not str or not key:
            return None
        kind = type(value)
        if kind in _SCALARS:
            continue
        if (kind is list or kind is tuple) and all(type(v) is str for v in value):  # type: ignore[union-attr]
            plain = dict(plain) if plain is attributes else plain
            plain[key] = tuple(value)  # type: ignore[index, arg-type]
            continue
        return None
    return plain


_SPAN_TYPES: set[type] = {_FinishedAsIs, _Span, trace_api.NonRecordingSpan}
"""Span classes met in contexts, known to be `Span`s (a type check is a tenth of `isinstance`
against the API's abstract `Span`); others are checked with `isinstance` and added."""


def current_span_context(context: Context | None = None) -> trace_api.SpanContext:
    """`trace.get_current_span(context).get_span_context()`, without the abstract-class check for
    the span classes already met."""
    span = (context if context is not None else get_current()).get(_SPAN_KEY)
    kind = type(span)
    if kind not in _SPAN_TYPES:
        if not isinstance(span, trace_api.Span):
            return trace_api.INVALID_SPAN_CONTEXT
        _SPAN_TYPES.add(kind)
    return span.get_span_context()  # type: ignore[attr-defined]


class _FastTracer(Tracer):
    _stacx_state: tuple[object, ...] | None = None
    """What the short path was last checked against (sampler, span processor, resource, limits,
    scope, tracer metrics, the multi-processor's processors), then the state its spans start from
    (None: the SDK's path)."""

    def start_span(  # noqa: PLR0913 - the API's signature
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace_api.Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        parent: trace_api.SpanContext | None = current_span_context(context)
        if parent is not None and not parent.is_valid:
            parent = None
        template = self._short_path(parent)
        if template is None:
            return super().start_span(
                name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
            )
        span = _FinishedAsIs.__new__(_FinishedAsIs)
        state = span.__dict__
        state.update(template)
        state["_name"], state["_kind"], state["_parent"] = name, kind, parent
        state["_context"] = self._span_context(parent)
        if not (record_exception and set_status_on_exception):
            state["_record_exception"], state["_set_status_on_exception"] = (
                record_exception,
                set_status_on_exception,
            )
        limits = self._span_limits
        state["_lock"] = threading.Lock()
        state["_attributes"] = bounded = BoundedAttributes(
            limits.max_span_attributes, None, immutable=False, max_value_len=limits.max_span_attribute_length
        )
        plain = _plain(bounded, attributes) if attributes else None
        if plain is not None:
            bounded._dict.update(plain)
        elif attributes:  # the SDK's cleaning, as its constructor does it
            state["_attributes"] = BoundedAttributes(
                limits.max_span_attributes,
                attributes,
                immutable=False,
                max_value_len=limits.max_span_attribute_length,
            )
        state["_events"] = _NONE_YET
        state["_links"] = span._new_links(links) if links else _NONE_YET
        state["_start_time"] = start_time if start_time is not None else time_ns()
        template["_span_processor"].on_start(span, parent_context=context)  # type: ignore[attr-defined]
        return span

    def _span_context(self, parent: trace_api.SpanContext | None) -> trace_api.SpanContext:
        """A sampled child of a (valid) parent, in its trace; else the root of a new trace."""
        if parent is not None:
            flags = TraceFlags(TraceFlags.SAMPLED | (parent.trace_flags & TraceFlags.RANDOM_TRACE_ID))
            return trace_api.SpanContext(
                parent.trace_id, self.id_generator.generate_span_id(), False, flags, parent.trace_state
            )
        random_id = TraceFlags.RANDOM_TRACE_ID if self.id_generator.is_trace_id_random() else 0
        return trace_api.SpanContext(
            self.id_generator.generate_trace_id(),
            self.id_generator.generate_span_id(),
            False,
            TraceFlags(TraceFlags.SAMPLED | random_id),
        )

    def _short_path(self, parent: trace_api.SpanContext | None) -> dict[str, object] | None:
        """The state a span starts from when the sampler would keep it and nothing else needs the
        SDK's path (None otherwise)."""
        if parent is not None and not parent.trace_flags.sampled:
            return None
        known = self._stacx_state
        metrics = getattr(self, "_tracer_metrics", None)
        processors = getattr(self.span_processor, "_span_processors", None)
        if (
            known is None
            or known[0] is not self.sampler
            or known[1] is not self.span_processor
            or known[2] is not self.resource
            or known[3] is not self._span_limits
            or known[4] is not self._instrumentation_scope
            or known[5] is not metrics
            or known[6] is not processors
        ):
            fast = _always_on(self.sampler) and isinstance(metrics, NoOpTracerMetrics)
            sources = (self.sampler, self.span_processor, self.resource, self._span_limits)
            template = _template(self, _target(self.span_processor)) if fast else None
            known = (*sources, self._instrumentation_scope, metrics, processors, template)
            self._stacx_state = known
        return known[7] if self._is_enabled() else None  # type: ignore[return-value]


def _target(processor: SpanProcessor) -> SpanProcessor:
    """Where a span's start and end go: the provider's one span processor itself when it has
    exactly one (no loop through the SDK's multi-processor), else the multi-processor."""
    if type(processor) is SynchronousMultiSpanProcessor:
        processors = getattr(processor, "_span_processors", None)
        if type(processors) is tuple and len(processors) == 1:
            return processors[0]  # type: ignore[no-any-return]
    return processor


_SPAN_STATE = frozenset(
    {
        "_name", "_context", "_kind", "_instrumentation_info", "_instrumentation_scope", "_parent",
        "_start_time", "_end_time", "_attributes", "_events", "_links", "_resource", "_status",
        "_sampler", "_trace_config", "_record_exception", "_set_status_on_exception",
        "_span_processor", "_limits", "_lock", "_record_end_metrics",
    }
)  # fmt: skip
"""What an SDK span holds, as of the releases this path was written against; the short path fills
in the per-span ones (name, kind, context, parent, lock, attributes, events, links, start time)."""


def _template(tracer: Tracer, processor: SpanProcessor) -> dict[str, object] | None:
    try:
        span = _FinishedAsIs(
            name="",
            context=trace_api.INVALID_SPAN_CONTEXT,
            parent=None,
            sampler=tracer.sampler,
            resource=tracer.resource,
            attributes=None,
            span_processor=processor,
            kind=SpanKind.INTERNAL,
            links=(),
            instrumentation_info=tracer.instrumentation_info,
            record_exception=True,
            set_status_on_exception=True,
            limits=tracer._span_limits,
            instrumentation_scope=tracer._instrumentation_scope,
        )
    except (AttributeError, TypeError):  # an SDK whose internals moved: its own path
        return None
    state = dict(getattr(span, "__dict__", {}))
    if set(state) != _SPAN_STATE or not isinstance(getattr(state["_attributes"], "_dict", None), dict):
        return None
    if not hasattr(span, "_new_links") or not isinstance(state["_events"], BoundedList):
        return None
    if not all(callable(getattr(span, name, None)) for name in ("_add_event", "_add_link")):
        return None
    return state


def _always_on(sampler: object) -> bool:
    """`ParentBased(ALWAYS_ON)` with its default delegates: every root kept, children follow."""
    delegates = {
        name: getattr(sampler, name, None)
        for name in ("_root", "_remote_parent_sampled", "_local_parent_sampled")
    }
    return (
        isinstance(sampler, ParentBased)
        and all(d is ALWAYS_ON for d in delegates.values())
        and getattr(sampler, "_remote_parent_not_sampled", None) is ALWAYS_OFF
        and getattr(sampler, "_local_parent_not_sampled", None) is ALWAYS_OFF
    )


class FastTracerProvider(TracerProvider):
    """`TracerProvider` whose tracers take the short path above when the sampler allows it."""

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> trace_api.Tracer:
        tracer = super().get_tracer(
            instrumenting_module_name, instrumenting_library_version, schema_url, attributes
        )
        if type(tracer) is Tracer:  # made (and cached) by the SDK: same state, shorter start_span
            tracer.__class__ = _FastTracer
        return tracer
