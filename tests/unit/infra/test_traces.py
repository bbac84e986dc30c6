"""`stacx trace`'s reading of Jaeger's query API JSON: the tree, links, hidden framework spans and
the waterfall picture."""

from __future__ import annotations

from pathlib import Path

from stacx.infra.traces import parse_trace, render_tree, render_waterfall

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
