"""A batching span processor with a shorter path from `span.end()` to the export queue.

The SDK's `BatchSpanProcessor` hands each ended span through two layers (the processor, then its
shared `BatchProcessor`) that check for shutdown, call `os.getpid()` (a system call) to detect a
fork, compare the queue length twice and keep the SDK's processor metrics. `BufferedSpanProcessor`
keeps the same contract with less per span: ended, sampled spans are appended to a bounded queue
(a span arriving at a full queue, or after shutdown, is dropped and counted in `dropped`), a
worker thread exports them in batches of at most `max_export_batch_size` every
`schedule_delay_millis` or as soon as a batch is full, `force_flush` exports everything queued
and `shutdown` exports what is left and shuts the exporter down. A fork is handled by a handler
registered once (`os.register_at_fork`), not checked per span: the child starts with an empty
queue and its own worker.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import weakref

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["BufferedSpanProcessor"]

log = logging.getLogger(__name__)


class BufferedSpanProcessor(SpanProcessor):
    """Queue ended, sampled spans; export them from one worker thread, by time or by batch size."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        schedule_delay_millis: float = 5000,
        max_export_batch_size: int = 512,
        max_queue_size: int = 2048,
    ) -> None:
        if schedule_delay_millis <= 0:
            raise ValueError(f"schedule_delay_millis={schedule_delay_millis}: give a delay above 0 ms")
        if max_queue_size <= 0:
            raise ValueError(f"max_queue_size={max_queue_size}: give a queue size above 0")
        if not 0 < max_export_batch_size <= max_queue_size:
            raise ValueError(
                f"max_export_batch_size={max_export_batch_size}: give a batch size above 0 and at most "
                f"max_queue_size ({max_queue_size})"
            )
        self.exporter = exporter
        self._delay_s = schedule_delay_millis / 1000
        self._batch_size = max_export_batch_size
        self._queue_size = max_queue_size
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._closed = False
        self.dropped = 0
        """Spans dropped: the queue was full, or the processor was shut down."""
        self._start_worker()
        ref = weakref.ref(self)

        def after_in_child() -> None:
            processor = ref()
            if processor is not None:
                processor._start_worker()

        os.register_at_fork(after_in_child=after_in_child)

    def _start_worker(self) -> None:
        """A fresh queue, wake-up event, export lock and worker thread (at start and in a forked
        child, where the parent's thread does not exist)."""
        self._queue.clear()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._worker = threading.Thread(target=self._work, name="StacxSpanExport", daemon=True)
        self._worker.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def _on_ending(self, span: Span) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None or not context.trace_flags.sampled:
            return
        queue = self._queue
        if self._closed or len(queue) >= self._queue_size:
            self._drop()
            return
        queue.append(span)
        if len(queue) >= self._batch_size and not self._wake.is_set():
            self._wake.set()

    def _drop(self) -> None:
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:  # 1st, 2nd, 4th, 8th...: a line, not a flood
            reason = "shut down" if self._closed else f"queue full ({self._queue_size} spans)"
            log.warning("span export: %s, %d spans dropped so far", reason, self.dropped)

    def _work(self) -> None:
        while not self._closed:
            self._wake.wait(self._delay_s)
            self._wake.clear()  # before exporting: a batch filled meanwhile wakes the next round
            self._export_queued()
        self._export_queued()

    def _export_queued(self) -> None:
        """Export everything queued now, in batches of at most `max_export_batch_size`."""
        with self._export_lock:
            queue = self._queue
            while queue:
                batch = [queue.popleft() for _ in range(min(self._batch_size, len(queue)))]
                token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # the export makes no spans
                try:
                    self.exporter.export(batch)
                except Exception:  # an export failing must not stop the worker
                    log.exception("span export failed (%d spans)", len(batch))
                finally:
                    detach(token)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued (False once shut down)."""
        if self._closed:
            return False
        self._export_queued()
        return True

    def shutdown(self) -> None:
        """Stop taking spans, export what is queued, shut the exporter down (once)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._worker.join(timeout=30)
        self._export_queued()
        self.exporter.shutdown()
