"""Trace context through the assembler: a batch span linked to every trajectory it packs.

Stage 1 remembers each trajectory event's `traceparent` by group; when the group closes, its
traceparents ride on the internal group event as one header (`stacx-trace-links`, JSON
trajectory id -> traceparent), so stage 2 (possibly another worker) gets them back. A batch then
gets an `assembler.batch` span: a child of its first trajectory's context (so that episode's trace
continues to the trainer step and the weight swap) and *linked* to every other trajectory it used.
Each of those others gets an `assembler.packed` span in its own trace, linked back to the batch span
(`stacx trace` follows it to the step that trained the episode). The batch event carries the batch
span's context. With tracing off nothing is remembered or made.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from stacx.producers.tracing import TRACEPARENT, context_from_headers, trace_headers, tracing_on

__all__ = ["LINKS_HEADER", "TraceLinks"]

LINKS_HEADER = "stacx-trace-links"
MAX_REMEMBERED = 100_000
"""Bound on remembered trajectories (the oldest are forgotten: their batch just lacks a link)."""


def _header(headers: Any, name: str) -> str | None:
    pairs = headers.items() if hasattr(headers, "items") else (headers or [])
    for key, value in pairs:
        if key == name and value is not None:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return None


class TraceLinks:
    """Which trace context each trajectory came with, from stage 1 to the batch span."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.max_remembered = max_remembered
        self._by_group: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._by_trajectory: OrderedDict[str, str] = OrderedDict()

    # -- stage 1 ---------------------------------------------------------------------------------

    def remember(self, group_id: str, trajectory_id: str, headers: Any) -> None:
        """A trajectory event's traceparent, kept until its group closes."""
        parent = _header(headers, TRACEPARENT)
        if parent is None:
            return
        self._by_group.setdefault(group_id, {})[trajectory_id] = parent
        self._by_group.move_to_end(group_id)
        while len(self._by_group) > self.max_remembered:
            self._by_group.popitem(last=False)

    def group_headers(self, group_id: str) -> list[tuple[str, bytes]] | None:
        """The header carrying a closed group's traceparents to stage 2 (None: none known)."""
        known = self._by_group.pop(group_id, None)
        if not known:
            return None
        return [(LINKS_HEADER, json.dumps(known, separators=(",", ":")).encode())]

    # -- stage 2 ---------------------------------------------------------------------------------

    def take_group(self, headers: Any) -> None:
        """Read a group event's traceparents (kept until the batch that packs them)."""
        text = _header(headers, LINKS_HEADER)
        if text is None:
            return
        try:
            known = json.loads(text)
        except ValueError:
            return
        for trajectory_id, parent in known.items():
            self._by_trajectory[str(trajectory_id)] = str(parent)
        while len(self._by_trajectory) > self.max_remembered:
            self._by_trajectory.popitem(last=False)

    def take_trajectory(self, trajectory_id: str) -> list[tuple[str, bytes]]:
        """The Kafka header carrying a pooled trajectory's own traceparent (for its dead letter
        when its group cannot be packed); [] when none is known."""
        parent = self._by_trajectory.pop(trajectory_id, None)
        return [] if parent is None else [(TRACEPARENT, parent.encode())]

    @contextmanager
    def batch_span(
        self, batch_id: str, trajectory_ids: Sequence[str]
    ) -> Iterator[list[tuple[str, bytes]] | None]:
        """An `assembler.batch` span for one batch; yields the Kafka headers of the batch event
        (its context), or None with tracing off."""
        parents = [(t, self._by_trajectory.pop(t)) for t in trajectory_ids if t in self._by_trajectory]
        if not tracing_on():
            yield None
            return
        contexts = [(t, context_from_headers([(TRACEPARENT, p.encode())])) for t, p in parents]
        valid = [(t, c) for t, c in contexts if trace.get_current_span(c).get_span_context().is_valid]
        # the first trajectory is the parent; the others are links (a link to the parent itself
        # would hide the parent relation in Jaeger, which turns it into FOLLOWS_FROM)
        links = [trace.Link(trace.get_current_span(c).get_span_context()) for _, c in valid[1:]]
        attributes: dict[str, Any] = {
            "stacx.batch_id": batch_id,
            "stacx.num_trajectories": len(trajectory_ids),
            "stacx.num_linked": len(links),
        }
        tracer = trace.get_tracer("stacx.assembler")
        with tracer.start_as_current_span(
            "assembler.batch", context=valid[0][1] if valid else None, links=links, attributes=attributes
        ) as batch:
            _mark_packed(tracer, valid[1:], batch_id, batch.get_span_context())
            yield trace_headers()


def _mark_packed(
    tracer: trace.Tracer, packed: Sequence[tuple[str, Any]], batch_id: str, batch: trace.SpanContext
) -> None:
    """In each linked trajectory's own trace, an `assembler.packed` span linked to the batch span:
    every episode's trace leads on to the batch (and its trainer step), not only the first's."""
    for trajectory_id, context in packed:
        attributes = {"stacx.batch_id": batch_id, "stacx.trajectory_id": trajectory_id,
                      "stacx.batch_trace_id": trace.format_trace_id(batch.trace_id)}
        tracer.start_span("assembler.packed", context=context, links=[trace.Link(batch)],
                          attributes=attributes).end()
