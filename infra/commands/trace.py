"""`stacx trace ID`: one trace from the trace backend, as a span tree with timings and a waterfall.

ID is a trace id (32 hex digits) or a trajectory, batch, record, group or task id: the spans that
carry it as a `stacx.*` attribute name their traces. An episode's trace is followed, through the
link of its `assembler.packed` span, to the batch, the trainer step and the weight swap.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_QUERY_URL = "http://127.0.0.1:16686"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trace", help="print a trace (span tree with timings) from Jaeger's query API and draw its waterfall"
    )
    p.add_argument("id", help="trace id, or a trajectory / batch / group / task id")
    p.add_argument(
        "--query-url",
        default=os.environ.get("STACX_TRACE_QUERY_URL", DEFAULT_QUERY_URL),
        help=f"trace backend query API (default: $STACX_TRACE_QUERY_URL, else {DEFAULT_QUERY_URL})",
    )
    p.add_argument("--out", type=Path, help="waterfall picture, .png or .svg (default: trace-<id>.png)")
    p.add_argument("--no-picture", action="store_true", help="print the tree only")
    p.add_argument(
        "--all-spans",
        action="store_true",
        help="keep the web framework's own spans (fastapi.*), hidden by default",
    )
    p.add_argument(
        "--lookback", default="24h", help="how far back to search for an id (Jaeger syntax: 2h, 7d)"
    )
    p.set_defaults(func=_trace)


def _trace(args: argparse.Namespace) -> int:
    from stacx.infra.traces import (
        FRAMEWORK_SPANS,
        TraceQueryError,
        fetch_trace,
        find_traces,
        follow_training,
        render_tree,
        render_waterfall,
    )

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per query otherwise
    try:
        trace_ids = find_traces(args.query_url, args.id.strip(), lookback=args.lookback)
        if not trace_ids:
            print(
                f"stacx trace: no trace has a span with id {args.id!r} (within {args.lookback})",
                file=sys.stderr,
            )
            return 1
        if len(trace_ids) > 1:
            print(f"{args.id} appears in {len(trace_ids)} traces: {', '.join(trace_ids)}; showing the first")
        trace = fetch_trace(args.query_url, trace_ids[0])
        if trace is None:
            print(f"stacx trace: the backend has no trace {trace_ids[0]}", file=sys.stderr)
            return 1
        trace = follow_training(args.query_url, trace)  # on to the step that trained the episode
    except TraceQueryError as exc:
        print(f"stacx trace: {exc}", file=sys.stderr)
        return 1
    if not args.all_spans:
        trace = trace.without(FRAMEWORK_SPANS)
    print(render_tree(trace))
    if not args.no_picture:
        out = args.out or Path(f"trace-{trace.trace_id}.png")
        if out.suffix.lower() not in {".png", ".svg"}:
            print(f"stacx trace: --out {out}: use a .png or .svg file name", file=sys.stderr)
            return 2
        print(f"waterfall: {render_waterfall(trace, out)}")
    return 0
