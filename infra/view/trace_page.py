"""The view's own trace page: an episode's trace read from the trace backend's query API (Jaeger's
`/api/traces`), followed to the step that trained it, drawn as a waterfall (matplotlib SVG) and a
span table. The Jaeger that `stacx infra up` builds has no UI of its own; this page is the UI."""

from __future__ import annotations

from html import escape

from stacx.infra.traces import Trace, waterfall_svg
from stacx.infra.view.pages import html_page

__all__ = ["trace_page"]

SHOWN_ATTRIBUTES = (
    "stacx.trajectory_id",
    "stacx.batch_id",
    "stacx.step",
    "stacx.weight_version",
    "stacx.policy_version",
    "stacx.num_linked",
)
"""Span attributes the table shows (ids a reader follows)."""
TRAINING = ("assembler.batch", "trainer.step", "weights.swap")


def trace_page(trace_id: str, trace: Trace | None, *, query_url: str, error: str | None) -> str:
    """The page of `trace_id`: its spans, or why there are none (then it reloads itself)."""
    head = f'<h1>Trace <code id="trace-id">{escape(trace_id)}</code></h1>'
    if trace is None:
        why = error or (
            f"the trace backend at {query_url} has no trace {trace_id} (yet: services export their "
            "spans every few seconds)"
        )
        return html_page(f"trace {trace_id[:12]}", head + f'<p class="error" id="no-trace">{escape(why)}</p>',
                     live=True)
    reached = [name for name in TRAINING if trace.named(name)]
    path = (
        f'<p id="training">this episode reaches {escape(" → ".join(reached))}</p>'
        if reached
        else '<p id="training" class="muted">not trained yet: no batch has packed this episode</p>'
    )
    body = (
        head
        + f'<p class="muted">{len(trace.spans)} spans from {escape(query_url)}</p>'
        + path
        + f'<div id="waterfall">{waterfall_svg(trace)}</div>'
        + _span_table(trace)
    )
    return html_page(f"trace {trace_id[:12]}", body, live=False)


def _span_table(trace: Trace) -> str:
    origin = trace.start_us
    rows = []
    for depth, span in trace.ordered():
        ids = " ".join(
            f"{k.removeprefix('stacx.')}={v}" for k, v in span.attributes.items() if k in SHOWN_ATTRIBUTES
        )
        rows.append(
            f'<tr class="span" data-name="{escape(span.name)}">'
            f'<td class="num">{(span.start_us - origin) / 1000:.1f}</td>'
            f'<td class="num">{span.duration_us / 1000:.1f}</td>'
            f"<td>{escape(span.service)}</td>"
            f'<td style="padding-left:{10 + 14 * depth}px">{escape(span.name)}</td>'
            f"<td>{escape(ids)}</td></tr>"
        )
    return (
        '<table id="spans"><tr><th>start (ms)</th><th>duration (ms)</th><th>service</th>'
        f"<th>span</th><th>ids</th></tr>{''.join(rows)}</table>"
    )
