"""Trace context on every event when tracing is on, nothing at all when it is off; the assembler's
batch span links every trajectory; the OTEL_* variables and the `tracing:` section."""

from __future__ import annotations

import json

import pytest
from events_strategies import trajectory
from opentelemetry import trace
from tracing_fixtures import in_memory_tracing

from stacx.consumers.assembly.tracing import LINKS_HEADER, TraceLinks
from stacx.infra.telemetry import TracingConfig
from stacx.producers import EventProducer
from stacx.producers.tracing import (
    TRACEPARENT,
    context_from_headers,
    publish_span,
    span,
    tracer_for,
    tracing_on,
)
from stacx.schemas.records import Trajectory


def _producer() -> EventProducer:
    return EventProducer(EventProducer.Config(bootstrap_servers="127.0.0.1:1", register_schemas=False))


def _trace_id(headers: list[tuple[str, bytes]] | None) -> int:
    return trace.get_current_span(context_from_headers(headers or [])).get_span_context().trace_id


def test_no_headers_and_no_spans_while_tracing_is_off() -> None:
    assert not tracing_on()
    producer = _producer()
    try:
        with publish_span("stacx.trajectories", "t-1"):
            assert producer._headers(None) is None
        with span("stacx.test", "nothing") as current:
            assert current is None
    finally:
        producer.close(0)


def test_a_span_is_current_inside_its_block_and_ended_after_it() -> None:
    with in_memory_tracing() as spans:
        with span("stacx.test", "outer") as outer:
            assert outer is not None and trace.get_current_span() is outer
            with span("stacx.test", "inner") as inner:
                assert trace.get_current_span() is inner
            assert trace.get_current_span() is outer and not inner.is_recording()
        assert not trace.get_current_span().get_span_context().is_valid
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert by_name["inner"].parent is not None
    assert by_name["inner"].parent.span_id == by_name["outer"].context.span_id
    assert by_name["outer"].status.status_code is trace.StatusCode.UNSET


def test_an_exception_leaving_a_span_is_recorded_as_an_error_and_the_span_still_ends() -> None:
    with in_memory_tracing() as spans:
        with pytest.raises(RuntimeError), span("stacx.test", "failing"):
            raise RuntimeError("sandbox gone")
        assert not trace.get_current_span().get_span_context().is_valid  # the context is restored
    (failed,) = spans.get_finished_spans()
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert failed.status.description == "RuntimeError: sandbox gone"
    assert [e.name for e in failed.events] == ["exception"]


def test_an_event_outside_any_span_gets_a_publish_span_and_its_traceparent() -> None:
    producer = _producer()
    try:
        with in_memory_tracing() as spans:
            assert tracing_on()
            with publish_span("stacx.batches", "b-1"):
                headers = producer._headers({"content-type": "avro"})
        assert headers is not None
        names = [k for k, _ in headers]
        assert names.count(TRACEPARENT) == 1 and "content-type" in names
        (published,) = spans.get_finished_spans()
        assert published.name == "publish stacx.batches"
        assert published.kind is trace.SpanKind.PRODUCER
        assert published.attributes["stacx.record_id"] == "b-1"
        assert _trace_id(headers) == published.context.trace_id
    finally:
        producer.close(0)


def test_a_publish_inside_a_span_continues_its_trace() -> None:
    producer = _producer()
    try:
        with in_memory_tracing() as spans:
            with span("stacx.test", "episode") as episode:
                assert episode is not None
                with publish_span("stacx.trajectories"):
                    headers = producer._headers(None)
        publish = next(s for s in spans.get_finished_spans() if s.name.startswith("publish"))
        assert publish.parent is not None and publish.parent.span_id == episode.get_span_context().span_id
        assert _trace_id(headers) == episode.get_span_context().trace_id
    finally:
        producer.close(0)


def test_a_traceparent_given_by_the_caller_is_kept_not_replaced() -> None:
    """A dead letter or a re-published event keeps the original event's trace."""
    original = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    producer = _producer()
    try:
        with in_memory_tracing():
            with publish_span("stacx.dlq"):
                headers = producer._headers({TRACEPARENT: original})
        assert headers == [(TRACEPARENT, original.encode())]
    finally:
        producer.close(0)


def test_every_event_names_its_content_type_and_schema_unless_the_caller_does() -> None:
    producer = _producer()
    try:
        value = producer.codec.encode(trajectory(1))
        fingerprint = producer.codec.local_schema(Trajectory).fingerprint.encode()
        headers = dict(producer._headers(None, value) or [])  # tracing off: no trace context
        assert headers == {
            "content-type": b"avro/binary; framing=single-object",
            "stacx-schema-fingerprint": fingerprint,
        }
        kept = producer._headers({"content-type": "application/x-mine"}, value) or []
        assert [v for k, v in kept if k == "content-type"] == [b"application/x-mine"]
        assert ("stacx-schema-fingerprint", fingerprint) in kept
        assert producer._headers(None, b"opaque bytes") is None
    finally:
        producer.close(0)


def _traceparent(trace_id: int, span_id: int) -> bytes:
    return f"00-{trace_id:032x}-{span_id:016x}-01".encode()


def test_the_batch_span_continues_the_first_trajectory_and_links_the_others() -> None:
    links = TraceLinks()
    for i in range(3):
        links.remember("g-1", f"t-{i}", [(TRACEPARENT, _traceparent(100 + i, 200 + i))])
    links.remember("g-1", "t-untraced", [])
    header = links.group_headers("g-1")
    assert header is not None and header[0][0] == LINKS_HEADER
    assert set(json.loads(header[0][1])) == {"t-0", "t-1", "t-2"}
    assert links.group_headers("g-1") is None  # handed over once
    stage2 = TraceLinks()  # the batch stage may run in another worker
    stage2.take_group(header)
    with in_memory_tracing() as spans:
        with stage2.batch_span("b-1", ["t-0", "t-1", "t-2", "t-untraced"]) as batch_headers:
            pass
    *packed, batch = spans.get_finished_spans()
    assert batch.name == "assembler.batch"
    assert sorted(link.context.trace_id for link in batch.links) == [101, 102]
    # each linked trajectory's own trace leads on to the batch (the step that trains it)
    assert sorted((s.name, s.context.trace_id, s.parent.span_id) for s in packed if s.parent) == [
        ("assembler.packed", 101, 201),
        ("assembler.packed", 102, 202),
    ]
    for one in packed:
        ((link,),) = [one.links]
        assert (link.context.trace_id, link.context.span_id) == (100, batch.context.span_id)
        assert one.attributes["stacx.batch_id"] == "b-1"
        assert one.attributes["stacx.batch_trace_id"] == f"{100:032x}"
    assert sorted(s.attributes["stacx.trajectory_id"] for s in packed) == ["t-1", "t-2"]
    assert batch.parent is not None and (batch.parent.trace_id, batch.parent.span_id) == (100, 200)
    assert batch.attributes["stacx.num_linked"] == 2
    assert _trace_id(batch_headers) == 100


def test_no_batch_span_while_tracing_is_off() -> None:
    links = TraceLinks()
    links.take_group([(LINKS_HEADER, json.dumps({"t-0": _traceparent(1, 2).decode()}).encode())])
    with links.batch_span("b-1", ["t-0"]) as headers:
        assert headers is None


def test_tracing_config_from_the_otel_variables() -> None:
    assert not TracingConfig.from_env({}).enabled
    on = TracingConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9999"})
    assert on.enabled and on.endpoint == "http://127.0.0.1:9999"
    assert TracingConfig.from_env({"OTEL_TRACES_EXPORTER": "otlp"}).enabled
    assert not TracingConfig.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}).enabled
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        TracingConfig.from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


def test_spans_are_exported_every_five_seconds_unless_the_variable_says_otherwise() -> None:
    assert TracingConfig().export_delay_ms == TracingConfig.from_env({}).export_delay_ms == 5000
    assert TracingConfig.from_env({"OTEL_BSP_SCHEDULE_DELAY": "250"}).export_delay_ms == 250
    with pytest.raises(ValueError, match="OTEL_BSP_SCHEDULE_DELAY='1s'"):
        TracingConfig.from_env({"OTEL_BSP_SCHEDULE_DELAY": "1s"})


def test_the_tracing_section_round_trips_through_the_variables() -> None:
    section = TracingConfig(
        enabled=True, endpoint="http://127.0.0.1:4318", sample_ratio=0.25, export_delay_ms=200
    )
    back = TracingConfig.from_env(section.to_env())
    assert back.enabled and back.endpoint == section.endpoint and back.sample_ratio == 0.25
    assert back.export_delay_ms == 200  # a service started with the section's variables exports as often
    assert not TracingConfig.from_env(TracingConfig(enabled=False).to_env()).enabled


@pytest.mark.parametrize("ratio", [1.0, 0.5, 0.0])
def test_the_sampler_keeps_about_the_ratio_of_roots_and_follows_the_parent(ratio: float) -> None:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

    from stacx.infra.telemetry import sampler

    chosen, ids = sampler(ratio), RandomIdGenerator()
    roots = [chosen.should_sample(None, ids.generate_trace_id(), "root") for _ in range(2000)]
    kept = sum(r.decision.is_sampled() for r in roots) / len(roots)
    assert abs(kept - ratio) < 0.05
    for flags in (TraceFlags.SAMPLED, TraceFlags.DEFAULT):  # a child follows its parent, whatever the ratio
        parent = SpanContext(
            ids.generate_trace_id(), ids.generate_span_id(), is_remote=True, trace_flags=TraceFlags(flags)
        )
        child = chosen.should_sample(set_span_in_context(NonRecordingSpan(parent)), parent.trace_id, "child")
        assert child.decision.is_sampled() == (flags == TraceFlags.SAMPLED)


def test_each_installed_provider_gets_its_own_tracer_and_none_while_tracing_is_off() -> None:
    assert tracer_for("stacx.test") is None
    seen = []
    for _ in range(2):  # two providers one after the other, as two services' set-ups would be
        with in_memory_tracing() as exporter:
            tracer = tracer_for("stacx.test")
            assert tracer is not None and tracer_for("stacx.test") is tracer  # made once
            seen.append(tracer)
            with span("stacx.test", "step"):
                pass
            assert [s.name for s in exporter.get_finished_spans()] == ["step"]
    assert seen[0] is not seen[1]
    assert tracer_for("stacx.test") is None
