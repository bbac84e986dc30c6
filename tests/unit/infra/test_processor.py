"""`BufferedSpanProcessor`: every ended, sampled span exported once, in order; a bounded queue
whose drops are counted; flush, shutdown and fork behave."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from infra import telemetry
from infra.processor import BufferedSpanProcessor
from infra.telemetry import sampler
from infra.tracer import FastTracerProvider

SAMPLED = trace.TraceFlags(trace.TraceFlags.SAMPLED)
WAIT_S = 30.0
"""How long a test waits for the worker thread at most (not a timing assertion)."""


class _Kept(SpanExporter):
    """Keeps every exported batch; `gate` (when given) holds each export until it is set."""

    def __init__(self, gate: threading.Event | None = None, fail_first: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.exported = threading.Event()
        self.entered = threading.Event()
        self.gate, self.fail_first, self.shut = gate, fail_first, False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(WAIT_S)
        if self.fail_first:
            self.fail_first = False
            raise ConnectionError("backend gone")
        self.batches.append([s.name for s in spans])
        self.exported.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True

    @property
    def names(self) -> list[str]:
        return [name for batch in self.batches for name in batch]


def _tracing(processor: BufferedSpanProcessor, ratio: float = 1.0) -> FastTracerProvider:
    provider = FastTracerProvider(sampler=sampler(ratio))
    provider.add_span_processor(processor)
    return provider


def _end(provider: FastTracerProvider, *names: str) -> None:
    tracer = provider.get_tracer("stacx.test")
    for name in names:
        tracer.start_span(name).end()


def test_force_flush_exports_every_ended_span_once_in_order() -> None:
    kept = _Kept()
    processor = BufferedSpanProcessor(kept, schedule_delay_millis=600_000)
    provider = _tracing(processor)
    _end(provider, "a", "b", "c")
    assert kept.batches == []  # waiting for the delay or a full batch
    assert processor.force_flush()
    assert kept.names == ["a", "b", "c"]
    assert processor.force_flush() and kept.names == ["a", "b", "c"]  # nothing twice
    provider.shutdown()


def test_a_full_batch_is_exported_without_waiting_for_the_delay() -> None:
    kept = _Kept()
    provider = _tracing(BufferedSpanProcessor(kept, schedule_delay_millis=600_000, max_export_batch_size=3))
    _end(provider, "a", "b", "c")
    assert kept.exported.wait(WAIT_S)
    assert kept.batches == [["a", "b", "c"]]
    provider.shutdown()


def test_the_delay_exports_a_partial_batch() -> None:
    kept = _Kept()
    provider = _tracing(BufferedSpanProcessor(kept, schedule_delay_millis=20))
    _end(provider, "a")
    assert kept.exported.wait(WAIT_S)
    assert kept.names == ["a"]
    provider.shutdown()


def test_batches_hold_at_most_the_batch_size() -> None:
    kept = _Kept()
    processor = BufferedSpanProcessor(kept, schedule_delay_millis=600_000, max_export_batch_size=2)
    provider = _tracing(processor)
    gate = threading.Event()
    kept.gate = gate
    _end(provider, "a", "b")  # a full batch: the worker takes it and waits at the gate
    assert kept.entered.wait(WAIT_S)
    _end(provider, "c", "d", "e")
    gate.set()
    assert processor.force_flush()
    assert sorted(map(len, kept.batches), reverse=True) == [2, 2, 1]
    assert kept.names == ["a", "b", "c", "d", "e"]
    provider.shutdown()


def test_a_full_queue_drops_spans_and_counts_them() -> None:
    gate = threading.Event()
    kept = _Kept(gate)
    processor = BufferedSpanProcessor(
        kept, schedule_delay_millis=600_000, max_export_batch_size=2, max_queue_size=2
    )
    provider = _tracing(processor)
    _end(provider, "a", "b")  # a full batch: the worker takes it and waits at the gate
    assert kept.entered.wait(WAIT_S)
    _end(provider, "c", "d", "e", "f")  # the queue holds two
    assert processor.dropped == 2
    gate.set()
    assert processor.force_flush()
    assert kept.names == ["a", "b", "c", "d"]
    provider.shutdown()


def test_shutdown_exports_what_is_queued_then_refuses_spans() -> None:
    kept = _Kept()
    processor = BufferedSpanProcessor(kept, schedule_delay_millis=600_000)
    provider = _tracing(processor)
    _end(provider, "a", "b")
    provider.shutdown()
    assert kept.names == ["a", "b"] and kept.shut
    assert not processor._worker.is_alive()
    processor.on_end(kept_span := provider.get_tracer("stacx.test").start_span("late"))
    assert processor.dropped == 1 and kept_span.name not in kept.names
    assert not processor.force_flush()
    processor.shutdown()  # twice: nothing more
    assert kept.names == ["a", "b"]


def test_a_failed_export_does_not_stop_the_worker() -> None:
    kept = _Kept(fail_first=True)
    processor = BufferedSpanProcessor(kept, schedule_delay_millis=20)
    provider = _tracing(processor)
    _end(provider, "lost")
    assert kept.entered.wait(WAIT_S)
    _end(provider, "kept")
    assert kept.exported.wait(WAIT_S)
    assert kept.names == ["kept"] and processor._worker.is_alive()
    provider.shutdown()


def test_unsampled_spans_are_not_exported() -> None:
    kept = _Kept()
    processor = BufferedSpanProcessor(kept, schedule_delay_millis=600_000)
    provider = _tracing(processor, ratio=0.0)
    _end(provider, "dropped by the sampler")  # not recording: never reaches the processor
    recorded_only = trace.SpanContext(1, 2, is_remote=False, trace_flags=trace.TraceFlags(0))
    processor.on_end(ReadableSpan(name="recorded, not sampled", context=recorded_only))
    sampled = trace.SpanContext(1, 3, is_remote=False, trace_flags=SAMPLED)
    processor.on_end(ReadableSpan(name="sampled", context=sampled))
    processor.force_flush()
    assert kept.names == ["sampled"] and processor.dropped == 0
    provider.shutdown()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"schedule_delay_millis": 0}, "schedule_delay_millis"),
        ({"max_queue_size": 0}, "max_queue_size"),
        ({"max_export_batch_size": 0}, "max_export_batch_size"),
        ({"max_export_batch_size": 9, "max_queue_size": 8}, "max_export_batch_size"),
    ],
)
def test_bad_sizes_are_refused_naming_the_field(options: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}="):
        BufferedSpanProcessor(_Kept(), **options)  # type: ignore[arg-type]


def test_a_forked_child_has_its_own_worker_and_an_empty_queue() -> None:
    kept = _Kept()
    processor = BufferedSpanProcessor(kept, schedule_delay_millis=600_000)
    provider = _tracing(processor)
    _end(provider, "parent's")
    pid = os.fork()
    if pid == 0:  # the child: a live worker of its own, none of the parent's spans
        ok = processor._worker.is_alive() and not processor._queue
        _end(provider, "child's")
        ok = ok and processor.force_flush() and kept.names == ["child's"]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    processor.force_flush()
    assert kept.names == ["parent's"]
    provider.shutdown()


def test_the_standard_queue_variables_size_the_services_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4096")
    monkeypatch.delenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", raising=False)
    assert telemetry._env_size("OTEL_BSP_MAX_QUEUE_SIZE", 2048) == 4096
    assert telemetry._env_size("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512) == 512
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    with pytest.raises(ValueError, match="^OTEL_BSP_MAX_QUEUE_SIZE='lots': give a number of spans"):
        telemetry.setup_tracing("test", telemetry.TracingConfig(enabled=True))
    assert not telemetry._installed and telemetry.dropped_spans() == 0
