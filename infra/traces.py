"""Reading traces back from the trace backend's query API (Jaeger's `/api/traces`), as a span tree
with timings and as a waterfall picture (what `stacx trace` prints and draws)."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "FRAMEWORK_SPANS",
    "TRACE_ID",
    "Span",
    "Trace",
    "TraceQueryError",
    "fetch_trace",
    "find_traces",
    "follow_training",
    "render_tree",
    "render_waterfall",
    "waterfall_svg",
]

TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
SEARCH_TAGS = ("stacx.trajectory_id", "stacx.batch_id", "stacx.record_id", "stacx.group_id", "stacx.task_id")
"""Span attributes an id given to `stacx trace` is looked up in."""
FRAMEWORK_SPANS = ("fastapi.",)
"""FastAPI's per-request internals (dependencies, endpoint, serialization): noise in a trace view."""


class TraceQueryError(RuntimeError):
    """The backend cannot be asked, or has no such trace."""


@dataclass(slots=True)
class Span:
    span_id: str
    trace_id: str
    name: str
    service: str
    start_us: int
    duration_us: int
    parent_id: str | None
    links: list[tuple[str, str]]
    """(trace id, span id) of linked spans (FOLLOWS_FROM references)."""
    attributes: dict[str, Any]
    children: list[Span] = field(default_factory=list)


@dataclass(slots=True)
class Trace:
    trace_id: str
    spans: list[Span]

    @property
    def roots(self) -> list[Span]:
        ids = {s.span_id for s in self.spans}
        return sorted((s for s in self.spans if s.parent_id not in ids), key=lambda s: s.start_us)

    @property
    def start_us(self) -> int:
        return min(s.start_us for s in self.spans)

    @property
    def end_us(self) -> int:
        return max(s.start_us + s.duration_us for s in self.spans)

    def without(self, prefixes: tuple[str, ...]) -> Trace:
        """The trace minus spans whose name starts with one of `prefixes` (their children move up
        to the nearest kept ancestor)."""
        by_id = {s.span_id: s for s in self.spans}
        kept = [s for s in self.spans if not s.name.startswith(prefixes)]
        for span in kept:
            parent = by_id.get(span.parent_id or "")
            while parent is not None and parent.name.startswith(prefixes):
                parent = by_id.get(parent.parent_id or "")
            span.parent_id = parent.span_id if parent is not None else span.parent_id
            span.children = []
        ids = {s.span_id: s for s in kept}
        for span in kept:
            if span.parent_id in ids:
                ids[span.parent_id].children.append(span)
        return Trace(trace_id=self.trace_id, spans=kept)

    def subtree(self, root: Span) -> list[Span]:
        """`root` and every span under it."""
        out = [root]
        for child in sorted(root.children, key=lambda s: s.start_us):
            out += self.subtree(child)
        return out

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]

    def ordered(self) -> list[tuple[int, Span]]:
        """(depth, span) depth-first, children by start time."""
        out: list[tuple[int, Span]] = []

        def walk(span: Span, depth: int) -> None:
            out.append((depth, span))
            for child in sorted(span.children, key=lambda s: s.start_us):
                walk(child, depth + 1)

        for root in self.roots:
            walk(root, 0)
        return out


def parse_trace(data: dict[str, Any]) -> Trace:
    """One trace of the query API's JSON (`{"traceID", "spans", "processes"}`)."""
    processes = {pid: p.get("serviceName", "?") for pid, p in (data.get("processes") or {}).items()}
    spans = []
    for raw in data.get("spans") or []:
        parent, links = None, []
        for ref in raw.get("references") or []:
            if ref.get("refType") == "CHILD_OF" and ref.get("traceID") == raw["traceID"] and parent is None:
                parent = ref["spanID"]
            else:
                links.append((ref["traceID"], ref["spanID"]))
        spans.append(
            Span(
                span_id=raw["spanID"],
                trace_id=raw["traceID"],
                name=raw.get("operationName", "?"),
                service=processes.get(raw.get("processID", ""), "?"),
                start_us=int(raw.get("startTime", 0)),
                duration_us=int(raw.get("duration", 0)),
                parent_id=parent,
                links=links,
                attributes={t["key"]: t.get("value") for t in raw.get("tags") or []},
            )
        )
    by_id = {s.span_id: s for s in spans}
    for span in spans:
        if span.parent_id in by_id:
            by_id[span.parent_id].children.append(span)
    return Trace(trace_id=str(data.get("traceID", spans[0].trace_id if spans else "")), spans=spans)


def _get(url: str, params: dict[str, str] | None = None, timeout_s: float = 10.0) -> Any:
    try:
        response = httpx.get(url, params=params, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise TraceQueryError(
            f"the trace backend does not answer at {url} ({type(exc).__name__}); start it with "
            "`stacx infra up` or pass --query-url"
        ) from exc
    if response.status_code == 404:
        return None
    if not response.is_success:
        raise TraceQueryError(
            f"GET {response.url} answered HTTP {response.status_code}: {response.text[:200]}"
        )
    return response.json()


def fetch_trace(query_url: str, trace_id: str) -> Trace | None:
    """The whole trace `trace_id` (None if the backend has none)."""
    body = _get(f"{query_url.rstrip('/')}/api/traces/{trace_id}")
    data = (body or {}).get("data") or []
    return parse_trace(data[0]) if data else None


def find_traces(query_url: str, some_id: str, lookback: str = "24h", limit: int = 20) -> list[str]:
    """Trace ids of spans whose stacx.* id attributes (trajectory, batch, record, group, task) equal
    `some_id`; a 32-hex id that names a trace is that trace (trajectory and batch ids look alike)."""
    base = query_url.rstrip("/")
    if TRACE_ID.match(some_id) and _get(f"{base}/api/traces/{some_id}") is not None:
        return [some_id]
    services = (_get(f"{base}/api/services") or {}).get("data") or []
    found: list[str] = []
    for service in services:
        for tag in SEARCH_TAGS:
            params = {
                "service": service,
                "tags": json.dumps({tag: some_id}),
                "lookback": lookback,
                "limit": str(limit),
            }
            for data in (_get(f"{base}/api/traces", params) or {}).get("data") or []:
                if data["traceID"] not in found:
                    found.append(data["traceID"])
    return found


PACKED = "assembler.packed"
"""The span in a trajectory's own trace that links to the batch that packed it."""
BATCH = "assembler.batch"


def follow_training(query_url: str, trace: Trace) -> Trace:
    """`trace` continued to the training of its episode: where an `assembler.packed` span links to
    a batch in another trace (every trajectory but the first of a batch), that batch span and all
    under it (trainer step, weight publish, swaps) are fetched and hung under the packed span.
    `trace` as it is when it already holds its batch, or its batch is not in the backend (yet)."""
    if trace.named(BATCH):
        return trace
    for packed in trace.named(PACKED):
        for trace_id, span_id in packed.links:
            other = fetch_trace(query_url, trace_id)
            batch = next((s for s in other.spans if s.span_id == span_id), None) if other else None
            if other is not None and batch is not None:
                return _joined(trace, other.subtree(batch), under=packed)
    return trace


def _joined(trace: Trace, spans: list[Span], *, under: Span) -> Trace:
    """`trace` with `spans` (a subtree of another trace) hung under the span `under`."""
    moved = [dataclasses.replace(s, children=[]) for s in spans]
    moved[0].parent_id = under.span_id
    everything = [dataclasses.replace(s, children=[]) for s in trace.spans] + moved
    by_id = {s.span_id: s for s in everything}
    for span in everything:
        if span.parent_id in by_id:
            by_id[span.parent_id].children.append(span)
    return Trace(trace_id=trace.trace_id, spans=everything)


def render_tree(trace: Trace) -> str:
    """The span tree: start offset and duration (ms), service, name, ids worth knowing, links."""
    origin = trace.start_us
    total_ms = (trace.end_us - origin) / 1000
    lines = [f"trace {trace.trace_id}: {len(trace.spans)} spans, {total_ms:.1f} ms"]
    for depth, span in trace.ordered():
        ids = " ".join(
            f"{k.removeprefix('stacx.')}={v}"
            for k, v in span.attributes.items()
            if k
            in {
                "stacx.trajectory_id",
                "stacx.batch_id",
                "stacx.weight_version",
                "stacx.step",
                "stacx.policy_version",
                "gen_ai.usage.output_tokens",
                "stacx.num_linked",
            }
        )
        links = f"  links: {len(span.links)}" if span.links else ""
        lines.append(
            f"{(span.start_us - origin) / 1000:>10.1f} ms {span.duration_us / 1000:>9.1f} ms  "
            f"{'  ' * depth}{span.name} [{span.service}]{' ' + ids if ids else ''}{links}"
        )
    return "\n".join(lines)


def render_waterfall(trace: Trace, path: Path, max_spans: int = 60) -> Path:
    """A waterfall picture (PNG or SVG by the file's suffix): one bar per span, by service colour,
    indented by depth; links drawn as dotted lines to linked spans of the same trace."""
    import matplotlib.pyplot as plt

    fig = _waterfall(trace, max_spans)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def waterfall_svg(trace: Trace, max_spans: int = 60) -> str:
    """The waterfall as an inline `<svg>` element (text kept as text, so it reads and searches)."""
    import matplotlib
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig = _waterfall(trace, max_spans)
        fig.savefig(buffer, format="svg")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _waterfall(trace: Trace, max_spans: int) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = trace.ordered()[:max_spans]
    origin = trace.start_us
    services = sorted({s.service for _, s in rows})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(services)}
    height = max(2.5, 0.28 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(11, height))
    index = {span.span_id: i for i, (_, span) in enumerate(rows)}
    total_ms = max((trace.end_us - origin) / 1000, 1e-3)
    for i, (_, span) in enumerate(rows):
        start_ms = (span.start_us - origin) / 1000
        width_ms = max(span.duration_us / 1000, total_ms * 0.002)
        ax.barh(i, width_ms, left=start_ms, color=colours[span.service], height=0.7)
        ax.text(
            start_ms + width_ms + total_ms * 0.005,
            i,
            f"{span.duration_us / 1000:.1f} ms",
            va="center",
            fontsize=7,
        )
        for _, linked in span.links:
            if linked in index:
                ax.plot([start_ms, start_ms], [index[linked], i], linestyle=":", color="grey", linewidth=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{span.name} {'·' * depth}" for depth, span in rows], fontsize=8, family="monospace")
    ax.invert_yaxis()
    ax.set_xlabel("ms since the trace's first span")
    ax.set_title(f"trace {trace.trace_id} ({len(trace.spans)} spans)", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[s]) for s in services]
    ax.legend(handles, services, fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig
