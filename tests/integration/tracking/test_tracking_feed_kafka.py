"""The tracking feed on the real broker: it reads a run's topics in its own group, logs the
per-version series a reader of the topics computes, scrapes a real metrics endpoint, and its
group goes with the run when the run is deleted."""

from __future__ import annotations

import statistics
import threading
from pathlib import Path

import numpy as np
import uvicorn
from confluent_kafka.admin import AdminClient
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from idle_groups import assert_describe_finds_idle_group
from ports import free_port
from run_names import run_name

from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.pipeline.tracking import tracking_group
from stacx.infra.services import topic_admin
from stacx.infra.services.topics import ensure_topics
from stacx.infra.tracking import MetricsEndpoint, RunFigures, TrackingConfig, TrackingFeed, open_trackers
from stacx.producers import EventProducer
from stacx.rollout.inference.metrics import Metrics
from stacx.schemas.records import STEP_FIGURE_PREFIX, Trajectory, WeightVersion

REWARDS = {0: [1.0, 0.0, 0.0, 1.0], 1: [1.0, 1.0, 0.0, 1.0], 2: [1.0, 1.0, 1.0, 0.5]}
LOSSES = {1: 0.75, 2: 0.5}


def _trajectory(version: int, n: int, reward: float) -> Trajectory:
    return Trajectory(
        trajectory_id=f"v{version}-{n}",
        group_id=f"g{version}",
        sample_index=n,
        task_id=f"task{n}",
        task_type="math",
        model_name="policy",
        policy_version=version,
        reward=reward,
        token_ids=np.arange(4, dtype=np.int32),
        loss_mask=np.array([0, 0, 1, 1], np.uint8),
        logprobs=np.array([0, 0, -0.5, -0.5], np.float32),
    )


def _publish_run(bootstrap: str, run: RunTopics, metrics: Metrics) -> None:
    """What a run writes: episodes of v0, v1 (the trainer's), v1's episodes, v2, v2's episodes."""
    with EventProducer(EventProducer.Config(bootstrap_servers=bootstrap)) as producer:
        for version in (0, 1, 2):
            if version in LOSSES:
                metrics.inc("generated_tokens_total", 40)
                figures = {
                    STEP_FIGURE_PREFIX + "loss": repr(LOSSES[version]),
                    STEP_FIGURE_PREFIX + "seconds": "2.0",
                }
                weights = WeightVersion(model_name="policy", version=version, path="/w", metadata=figures)
                producer.publish(run.weights, weights, key="policy").result(timeout=30)
            for n, reward in enumerate(REWARDS[version]):
                producer.publish(run.trajectories, _trajectory(version, n, reward), key=f"g{version}").result(
                    timeout=30
                )


def _metrics_server(metrics: Metrics) -> tuple[str, uvicorn.Server]:
    app = FastAPI()
    app.get("/metrics", response_class=PlainTextResponse)(metrics.render)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    return f"http://127.0.0.1:{port}/metrics", server


def test_the_feed_logs_the_topics_series_and_its_group_goes_with_the_run(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_id = run_name("tracking")
    run = RunTopics.for_run(run_id, fresh=True)
    ensure_topics(kafka_bootstrap, run.specs())
    metrics = Metrics()
    url, server = _metrics_server(metrics)
    deleted = False
    try:
        trackers = open_trackers(
            TrackingConfig.model_validate(["tensorboard"]), name="t", run_id=run_id, root=tmp_path
        )
        config = TrackingFeed.Config(
            bootstrap_servers=kafka_bootstrap,
            topics=[run.trajectories, run.batches, run.weights],
            group_id=tracking_group(run_id),
            model_name="policy",
            endpoints=[MetricsEndpoint("inference", url)],
        )
        feed = TrackingFeed(
            config, trackers, RunFigures(settle_versions=1), run_config={"run_id": run_id}
        ).start()
        _publish_run(kafka_bootstrap, run, metrics)
        feed.log(2, {"eval/success": 0.5})
        feed.finish(drain=True)

        events = EventAccumulator(str(tmp_path / "tensorboard" / run_id))  # a subfolder per run
        events.Reload()

        def series(tag: str) -> list[tuple[int, float]]:
            return [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]

        assert series("rollout/reward_mean") == [
            (v, round(statistics.fmean(r), 6)) for v, r in REWARDS.items()
        ]
        assert series("rollout/reward_std") == [
            (v, round(statistics.pstdev(r), 6)) for v, r in REWARDS.items()
        ]
        assert series("trainer/loss") == list(LOSSES.items())
        assert series("trainer/seconds") == [(1, 2.0), (2, 2.0)]
        assert series("eval/success") == [(2, 0.5)]
        assert "inference/generated_tokens_per_s" in events.Tags()["scalars"]  # from the second scrape on
        assert series("inference/running_requests") == [(1, 0.0), (2, 0.0)]
        assert len(events.Tensors("trajectories/text_summary")) == 3  # a table per version

        _, groups = topic_admin.delete_run(kafka_bootstrap, run_id)
        deleted = True
        assert tracking_group(run_id) in groups
        listed = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_consumer_groups(request_timeout=30)
        assert tracking_group(run_id) not in {g.group_id for g in listed.result(timeout=60).valid}
    finally:
        server.should_exit = True
        if not deleted:
            topic_admin.delete_run(kafka_bootstrap, run_id)


def test_a_tracking_group_that_committed_nothing_belongs_to_its_run(kafka_bootstrap: str) -> None:
    """A feed stopped before its first commit leaves a group with no offsets: the run still owns it."""
    run_id = run_name("tracking-nocommit")
    run = RunTopics.for_run(run_id, fresh=True)
    ensure_topics(kafka_bootstrap, run.specs())
    assert_describe_finds_idle_group(kafka_bootstrap, run_id, tracking_group(run_id), run.weights)
