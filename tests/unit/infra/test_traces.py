"""`stacx trace`'s reading of Jaeger's query API JSON: the tree, links, hidden framework spans and
the waterfall picture."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from stacx.infra.traces import fetch_trace, follow_training, parse_trace, render_tree, render_waterfall

T = "0af7651916cd43dd8448eb211c80319c"


def _span(
    span_id: str,
    name: str,
    start: int,
    duration: int,
    parent: str | None = None,
    links: tuple[tuple[str, str], ...] = (),
    process: str = "p1",
) -> dict:
    refs = [{"refType": "CHILD_OF", "traceID": T, "spanID": parent}] if parent else []
    refs += [{"refType": "FOLLOWS_FROM", "traceID": t, "spanID": s} for t, s in links]
    return {
        "traceID": T,
        "spanID": span_id,
        "operationName": name,
        "references": refs,
        "startTime": start,
        "duration": duration,
        "processID": process,
        "tags": [{"key": "stacx.batch_id", "value": "b-1"}],
    }


DATA = {
    "traceID": T,
    "processes": {"p1": {"serviceName": "stacx-rollout"}, "p2": {"serviceName": "stacx-gateway"}},
    "spans": [
        _span("b", "sandbox.exec", 1_000, 2_000, parent="a"),
        _span("a", "rollout.episode", 0, 10_000),
        _span("c", "fastapi.endpoint", 1_100, 1_500, parent="b", process="p2"),
        _span("d", "gateway.exec", 1_200, 1_000, parent="c", process="p2"),
        _span("e", "assembler.batch", 11_000, 100, parent="a", links=(("f" * 32, "1" * 16),)),
    ],
}


def test_the_tree_orders_children_by_start_and_keeps_links_apart_from_the_parent() -> None:
    trace = parse_trace(DATA)
    assert [(depth, span.name) for depth, span in trace.ordered()] == [
        (0, "rollout.episode"),
        (1, "sandbox.exec"),
        (2, "fastapi.endpoint"),
        (3, "gateway.exec"),
        (1, "assembler.batch"),
    ]
    batch = trace.named("assembler.batch")[0]
    assert batch.parent_id == "a" and batch.links == [("f" * 32, "1" * 16)]
    text = render_tree(trace)
    assert text.splitlines()[0] == f"trace {T}: 5 spans, 11.1 ms"
    assert "links: 1" in text and "[stacx-gateway]" in text


def test_framework_spans_are_hidden_and_their_children_move_up() -> None:
    trace = parse_trace(DATA).without(("fastapi.",))
    assert [(depth, span.name) for depth, span in trace.ordered()] == [
        (0, "rollout.episode"),
        (1, "sandbox.exec"),
        (2, "gateway.exec"),
        (1, "assembler.batch"),
    ]


def test_the_waterfall_is_a_png_or_an_svg(tmp_path: Path) -> None:
    trace = parse_trace(DATA)
    assert render_waterfall(trace, tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in render_waterfall(trace, tmp_path / "t.svg").read_bytes()[:400]


EPISODE = "1" * 32
BATCH_TRACE = "2" * 32


def _raw(trace_id: str, span_id: str, name: str, start: int, parent: str | None = None,
         links: tuple[tuple[str, str], ...] = (), tags: dict[str, str] | None = None) -> dict:
    refs = [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": parent}] if parent else []
    refs += [{"refType": "FOLLOWS_FROM", "traceID": t, "spanID": s} for t, s in links]
    return {"traceID": trace_id, "spanID": span_id, "operationName": name, "references": refs,
            "startTime": start, "duration": 100, "processID": "p1",
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}


TRACES = {
    EPISODE: {  # a trajectory that was not its batch's first: its trace stops at the publish ...
        "traceID": EPISODE,
        "processes": {"p1": {"serviceName": "stacx-rollout"}},
        "spans": [
            _raw(EPISODE, "e1", "rollout.episode", 0),
            _raw(EPISODE, "e2", "publish stacx.trajectories.r", 50, parent="e1"),
            # ... but for the assembler's mark, which links to the batch span of the first's trace
            _raw(EPISODE, "e3", "assembler.packed", 900, parent="e2", links=((BATCH_TRACE, "b2"),),
                 tags={"stacx.batch_id": "b-1"}),
        ],
    },
    BATCH_TRACE: {
        "traceID": BATCH_TRACE,
        "processes": {"p1": {"serviceName": "stacx-assemble"}},
        "spans": [
            _raw(BATCH_TRACE, "b0", "rollout.episode", 10),
            _raw(BATCH_TRACE, "b1", "publish stacx.trajectories.r", 60, parent="b0"),
            _raw(BATCH_TRACE, "b2", "assembler.batch", 1000, parent="b1", tags={"stacx.batch_id": "b-1"}),
            _raw(BATCH_TRACE, "b3", "trainer.step", 2000, parent="b2"),
            _raw(BATCH_TRACE, "b4", "weights.swap", 3000, parent="b3"),
        ],
    },
}


class _Jaeger(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        trace_id = self.path.rsplit("/", 1)[-1]
        found = TRACES.get(trace_id)
        body = json.dumps({"data": [found]} if found else {"data": None}).encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_an_episode_trace_is_followed_through_its_packed_span_to_the_step_and_the_swap() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jaeger)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        episode = fetch_trace(url, EPISODE)
        assert episode is not None and not episode.named("trainer.step")
        followed = follow_training(url, episode)
    finally:
        server.shutdown()
    assert [(depth, span.name) for depth, span in followed.ordered()] == [
        (0, "rollout.episode"),
        (1, "publish stacx.trajectories.r"),
        (2, "assembler.packed"),
        (3, "assembler.batch"),  # the batch, not the other episode of its trace
        (4, "trainer.step"),
        (5, "weights.swap"),
    ]
    assert followed.trace_id == EPISODE
    text = render_tree(followed)
    assert "trainer.step" in text and "weights.swap" in text
    assert follow_training(url, followed) is followed  # it holds its batch already


def test_the_views_trace_page_draws_the_followed_trace_and_escapes_span_text() -> None:
    from stacx.infra.view.trace_page import trace_page

    hostile = dict(TRACES[EPISODE])
    hostile["spans"] = [*hostile["spans"], _raw(EPISODE, "e4", "<script>alert(1)</script>", 70, parent="e1")]
    html = trace_page(EPISODE, parse_trace(hostile), query_url="http://127.0.0.1:16686", error=None)
    assert html.count('<tr class="span"') == 4 and "<svg" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert 'id="training" class="muted"' in html  # not trained yet: no batch in this trace
    missing = trace_page(EPISODE, None, query_url="http://127.0.0.1:16686", error=None)
    assert 'id="no-trace"' in missing and 'http-equiv="refresh"' in missing
