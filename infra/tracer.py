"""The SDK's TracerProvider with a shorter path from `start_span` to the export queue.

Measured inside the rollout process on the 2-core machine, the SDK spent ~75 µs to start a span
and ~30 µs to end it (a tenth of that in a tight loop: hot paths run it with cold caches), most of
it in machinery that decides nothing for STACX's sampler. With every root kept (`sampler(1.0)`:
parent-based, always on), the decision is the parent's: a sampled parent gives a sampled child, no
parent gives a new sampled trace. `FastTracerProvider` makes such spans without the sampler call,
its result objects and the tracer's no-op metrics; and a finished span goes to the span processors
as itself (the SDK copies it into a `ReadableSpan` that shares its attributes, events and links
anyway; an ended span refuses changes). Anything else (a ratio sampler, an unsampled parent, a
disabled tracer, the SDK's own metrics turned on) takes the SDK's path unchanged, and so does
every span when an SDK release has moved the internals the short path uses (`_Span`'s constructor,
`ParentBased`'s delegates, `BoundedAttributes`): the tests compare both paths' spans.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Tracer, TracerProvider, _Span
from opentelemetry.sdk.trace._tracer_metrics import NoOpTracerMetrics
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, TraceFlags
from opentelemetry.util import types

__all__ = ["FastTracerProvider"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


_SCALARS = (str, bool, int, float)


class _FinishedAsIs(_Span):
    """An SDK span handed to the span processors as itself when it ends, whose plain attributes
    (strings, booleans and numbers within the limits) skip the SDK's per-value cleaning."""

    def _readable_span(self) -> ReadableSpan:
        return self

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        if not self._plain(attributes):
            super().set_attributes(attributes)
            return
        with self._lock:
            if self._end_time is not None:
                super().set_attributes(attributes)  # the SDK's warning for an ended span
                return
            try:
                self._attributes._dict.update(attributes)  # type: ignore[union-attr]
            except AttributeError:  # an SDK without that dict: its own path
                super().set_attributes(attributes)

    def _plain(self, attributes: Mapping[str, types.AnyValue]) -> bool:
        """Values the SDK would keep as they are, and room for all of them."""
        bounded = self._attributes
        if not isinstance(bounded, BoundedAttributes) or bounded.max_value_len is not None:
            return False
        if bounded.maxlen is not None and len(bounded) + len(attributes) > bounded.maxlen:
            return False
        for key, value in attributes.items():
            if type(key) is not str or not key or type(value) not in _SCALARS:
                return False
        return True


class _FastTracer(Tracer):
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
        parent: trace_api.SpanContext | None = trace_api.get_current_span(context).get_span_context()
        if not self._takes_fast_path(parent):
            return super().start_span(
                name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
            )
        if parent is not None and parent.is_valid:
            trace_id, state = parent.trace_id, parent.trace_state
            flags = TraceFlags(TraceFlags.SAMPLED | (parent.trace_flags & TraceFlags.RANDOM_TRACE_ID))
        else:
            parent, trace_id, state = None, self.id_generator.generate_trace_id(), None
            random_id = TraceFlags.RANDOM_TRACE_ID if self.id_generator.is_trace_id_random() else 0
            flags = TraceFlags(TraceFlags.SAMPLED | random_id)
        span_context = trace_api.SpanContext(
            trace_id,
            self.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=flags,
            trace_state=state,
        )
        try:
            span = _FinishedAsIs(
                name=name,
                context=span_context,
                parent=parent,
                sampler=self.sampler,
                resource=self.resource,
                attributes=None,
                span_processor=self.span_processor,
                kind=kind,
                links=links or (),
                instrumentation_info=self.instrumentation_info,
                record_exception=record_exception,
                set_status_on_exception=set_status_on_exception,
                limits=self._span_limits,
                instrumentation_scope=self._instrumentation_scope,
            )
        except (AttributeError, TypeError):  # an SDK whose internals moved: its own path
            return super().start_span(
                name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
            )
        if attributes:
            span.set_attributes(attributes)
        span.start(start_time=start_time, parent_context=context)
        return span

    def _takes_fast_path(self, parent: trace_api.SpanContext | None) -> bool:
        """The sampler would keep this span, and nothing else needs the SDK's path."""
        if not (_always_on(self.sampler) and self._is_enabled()):
            return False
        if not isinstance(getattr(self, "_tracer_metrics", None), NoOpTracerMetrics):
            return False
        return parent is None or not parent.is_valid or parent.trace_flags.sampled


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
