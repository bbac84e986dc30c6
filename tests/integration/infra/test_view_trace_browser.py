"""Acceptance (issue 57): a trajectory that was *not* first in its batch is traced to the step that
trained it. Episode spans, the real assembler's batch span (`TraceLinks`: links and
`assembler.packed` marks) and a trainer step and weight swap under the batch event's context go to
the local Jaeger over OTLP; then `stacx trace <trajectory id>` prints the step and the swap, and
headless Chromium follows the view's trace link to a page of spans, not Jaeger's placeholder.

Needs Kafka and Jaeger (`stacx infra up`), chromium and chromedriver."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from test_view_browser import SCREENSHOTS, STACX, _episode, _Run, browser, view  # noqa: F401 (fixtures)
from tracing_fixtures import in_memory_tracing, running_jaeger

from stacx.consumers.assembly.tracing import TraceLinks
from stacx.infra.traces import fetch_trace
from stacx.producers.tracing import TRACEPARENT, context_from_headers

PLACEHOLDER = "This is not the Jaeger UI"


@pytest.mark.timeout(600)
def test_a_non_first_trajectory_is_traced_to_its_training_step_in_stacx_trace_and_the_browser(
    kafka_bootstrap: str, tmp_path: Path, browser: Any, view: Any  # noqa: F811
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    jaeger = running_jaeger()
    url, _ = view
    run = _Run(kafka_bootstrap, tmp_path / "runs", tmp_path / "tokenizer")
    run.tok.save_pretrained(run.tokenizer_dir)  # the run folder names it
    run.write_folder()
    exporter = OTLPSpanExporter(endpoint=f"{jaeger.otlp_http_endpoint}/v1/traces")
    provider = TracerProvider(resource=Resource.create({"service.name": "stacx-view-test"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace_ids: dict[str, str] = {}
    with in_memory_tracing(provider):
        tracer = trace.get_tracer("test.view.trace")
        links = TraceLinks()  # the assembler's own trace handling: stage 1, then stage 2
        for sample in range(4):
            t = _episode(run.tok, task=5, sample=sample, version=0, reward=float(sample % 2))
            t = dataclasses.replace(t, trajectory_id=uuid.uuid4().hex)  # Jaeger keeps earlier runs' traces
            with tracer.start_as_current_span("rollout.episode") as episode:
                run.producer.publish(run.topics.trajectories, t).result(timeout=30)
                links.remember("g5", t.trajectory_id, [(TRACEPARENT, _traceparent(episode).encode())])
            trace_ids[t.trajectory_id] = f"{episode.get_span_context().trace_id:032x}"
        links.take_group(links.group_headers("g5"))
        ids = list(trace_ids)
        with links.batch_span("batch-5", ids) as batch_headers:
            pass
        with tracer.start_as_current_span("trainer.step", context=context_from_headers(batch_headers)):
            with tracer.start_as_current_span("weights.swap", attributes={"stacx.weight_version": 1}):
                pass
        provider.force_flush()
    chosen = random.choice(ids[1:])  # not the batch's first: its own trace stops at the publish
    trace_id = trace_ids[chosen]

    deadline = time.monotonic() + 60
    while (found := fetch_trace(jaeger.query_url, trace_id)) is None or not found.named("assembler.packed"):
        assert time.monotonic() < deadline, f"Jaeger has no complete trace {trace_id}"
        time.sleep(1)
    assert not found.named("trainer.step")  # the trajectory's own trace: the step is elsewhere

    command = [STACX, "trace", chosen, "--no-picture", "--query-url", jaeger.query_url]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "trainer.step" in printed and "weights.swap" in printed and "assembler.batch" in printed, printed

    browser.get(url + "/")
    WebDriverWait(browser, 60, poll_frequency=1).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f'tr.run[data-run-id="{run.run_id}"]')
    )
    browser.get(f"{url}/runs/{run.run_id}/trajectories")
    anchors = browser.find_elements(By.CSS_SELECTOR, "tr.trajectory a")
    next(a for a in anchors if chosen.startswith(a.text)).click()
    browser.find_element(By.ID, "trace-link").click()
    WebDriverWait(browser, 60, poll_frequency=1).until(lambda d: d.find_elements(By.ID, "spans"))
    names = {r.get_attribute("data-name") for r in browser.find_elements(By.CSS_SELECTOR, "#spans tr.span")}
    assert {"rollout.episode", "assembler.packed", "assembler.batch", "trainer.step", "weights.swap"} <= names
    assert PLACEHOLDER not in browser.page_source
    assert browser.find_elements(By.CSS_SELECTOR, "#waterfall svg")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "view-trace.png"))
    run.producer.close()


def _traceparent(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
