"""One trace from the task to the policy that learned from it, through the real services.

A short quickstart runs with `pipeline.tracing.enabled`; every service exports OTLP to the local
Jaeger that `stacx infra up` starts. From Jaeger's query API, the trace of a batch reaches from an
episode span through the gateway's exec span, the trajectory publish, the batch (by link), the
trainer step and the weight swap on the inference server; raw Kafka reads show `traceparent` on
every trajectory, batch and weight event. Needs Kafka, Docker, the sandbox image and Jaeger
(`stacx infra up`; `make test` does it): it fails, never skips, when Jaeger is missing.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from test_quickstart_e2e import REPO, _small
from tracing_fixtures import running_jaeger

from stacx.infra.pipeline import load_spec, run_pipeline
from stacx.infra.services.jaeger import JaegerConfig
from stacx.infra.telemetry import TracingConfig
from stacx.infra.traces import Trace, fetch_trace, follow_training, render_tree, render_waterfall

STEPS = 2


@pytest.fixture(scope="module")
def jaeger() -> JaegerConfig:
    return running_jaeger()


def _raw_records(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict[str, bytes]]]:
    """(key, headers) of every record of `topic`, read with a bare client (kcat -f '%k %h')."""
    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"raw-{topic}", "enable.auto.commit": False}
    )
    metadata = reader.list_topics(topic, timeout=10).topics[topic]
    partitions = [TopicPartition(topic, p, 0) for p in metadata.partitions]
    ends = {p.partition: reader.get_watermark_offsets(p, timeout=10)[1] for p in partitions}
    reader.assign(partitions)
    records: list[tuple[bytes | None, dict[str, bytes]]] = []
    done: dict[int, int] = {}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and any(done.get(p, 0) < end for p, end in ends.items()):
            msg = reader.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            records.append((msg.key(), dict(msg.headers() or [])))
            done[msg.partition()] = msg.offset() + 1
    finally:
        reader.close()
    return records


def _trace_id(traceparent: bytes) -> str:
    return traceparent.decode().split("-")[1]


def _complete_trace(
    jaeger: JaegerConfig, trace_ids: list[str], needed: set[str], timeout_s: float = 60
) -> Trace:
    """The first of `trace_ids` holding every span name in `needed` (spans arrive in batches, so
    ask again for a while). The last batch may not have been trained before the run ended."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        for trace_id in trace_ids:
            found = fetch_trace(jaeger.query_url, trace_id)
            names = {s.name for s in found.spans} if found else set()
            seen[trace_id] = sorted(needed - names)
            if found is not None and not seen[trace_id]:
                return found
        time.sleep(1.0)
    pytest.fail(f"no batch trace holds all of {sorted(needed)}; missing per trace: {seen}", pytrace=False)


def _ancestors(trace: Trace, span: Any) -> list[str]:
    by_id = {s.span_id: s for s in trace.spans}
    names = []
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        names.append(span.name)
    return names


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_one_trace_reaches_from_an_episode_to_the_weight_swap(
    kafka_bootstrap: str, docker_client: Any, sandbox_image: str, jaeger: JaegerConfig, tmp_path: Path
) -> None:
    spec = _small(load_spec(REPO / "examples" / "quickstart.yaml"), tmp_path)
    spec.bootstrap_servers = kafka_bootstrap
    cfg = spec.pipeline
    cfg.steps = STEPS
    cfg.sft.steps, cfg.sft.skill_steps, cfg.sft.batch_size = 60, 60, 16
    cfg.tasks.options.update(tool_fraction=1.0, skill_tool_fraction=1.0)  # every episode execs
    cfg.tracing = TracingConfig(enabled=True, endpoint=jaeger.otlp_http_endpoint, export_delay_ms=200)
    report = run_pipeline(spec)
    assert report["status"] == "ok", report["error"]
    run_id = report["run_id"]
    assert report["traces_by_version"], "the report names no episode trace"

    topics = {kind: f"stacx.{kind}.{run_id}" for kind in ("trajectories", "batches", "weights")}
    raw = {kind: _raw_records(kafka_bootstrap, topic) for kind, topic in topics.items()}
    for kind, records in raw.items():
        assert records, f"no {kind} event in {topics[kind]}"
        untraced = [key for key, headers in records if not headers.get("traceparent", b"").startswith(b"00-")]
        assert not untraced, (
            f"{len(untraced)} of {len(records)} {kind} events lack traceparent: {untraced[:3]}"
        )

    publish = f"publish {topics['trajectories']}"
    needed = {
        "rollout.episode",
        "sandbox.create",
        "gateway.create",
        "gateway.exec",
        publish,
        "assembler.batch",
        "trainer.step",
        "weights.swap",
        "inference.swap_weights",
    }
    trace = _complete_trace(jaeger, [_trace_id(h["traceparent"]) for _, h in raw["batches"]], needed)
    print(render_tree(trace))

    assert len(trace.named("rollout.episode")) == 1
    assert "rollout.episode" in _ancestors(trace, trace.named("gateway.exec")[0])
    assert "rollout.episode" in _ancestors(trace, trace.named(publish)[0])
    batch = trace.named("assembler.batch")[0]
    assert publish in _ancestors(trace, batch)
    linked = {span_id for _, span_id in batch.links}
    published = {h["traceparent"].decode().split("-")[2] for _, h in raw["trajectories"]}
    assert len(linked) + 1 == batch.attributes["stacx.num_trajectories"], (
        "a trajectory of the batch is not linked"
    )
    assert linked <= published, "the batch links spans that no trajectory event carries"
    step = trace.named("trainer.step")[0]
    assert "assembler.batch" in _ancestors(trace, step)
    swap = trace.named("inference.swap_weights")[0]
    assert {"weights.swap", "trainer.step", "assembler.batch", "rollout.episode"} <= set(
        _ancestors(trace, swap)
    )
    services = {s.service for s in trace.spans}
    assert {"stacx-rollout", "stacx-gateway", "stacx-assemble", "stacx-train", "stacx-serve"} <= services, (
        services
    )

    # any episode, not only a batch's first, leads to the step that trained it (issue 57)
    others = sorted(linked_trace for linked_trace, _ in batch.links)
    chosen = random.Random(run_id).choice(others)
    followed = follow_training(jaeger.query_url, fetch_trace(jaeger.query_url, chosen) or Trace(chosen, []))
    assert {"assembler.packed", "assembler.batch", "trainer.step", "weights.swap"} <= {
        s.name for s in followed.spans
    }, render_tree(followed)

    picture = render_waterfall(trace, tmp_path / "trace.png")
    assert picture.read_bytes()[:4] == b"\x89PNG"
    if os.environ.get("STACX_TRACE_PICTURE"):  # how docs/tracing.md's picture is made
        render_waterfall(trace, Path(os.environ["STACX_TRACE_PICTURE"]))
        print(render_tree(trace))
