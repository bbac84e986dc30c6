"""Acceptance (issue 57): after a run with stragglers (episodes that arrive after their version's row
was logged, and a last version of a few late episodes), every tracker, read with its own reader
(TensorBoard's `EventAccumulator`, `MlflowClient`, `wandb leet inspect --json`), holds for every
version, the last included, the figures our own consumer computes from the run's topics; the
staleness equals the view's; and no `_created` series was logged."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from ports import free_port
from run_names import run_name
from wandb_records import offline_runs

from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.pipeline.tracking import tracking_group
from stacx.infra.services import topic_admin
from stacx.infra.services.topics import ensure_topics
from stacx.infra.tracking import MetricsEndpoint, RunFigures, TrackingConfig, TrackingFeed, open_trackers
from stacx.infra.view.curves import staleness_of
from stacx.infra.view.reader import TrajectorySummary, VersionPoint
from stacx.producers import EventProducer
from stacx.rollout.inference.metrics import Metrics
from stacx.schemas.codec import decode
from stacx.schemas.records import STEP_FIGURE_PREFIX, Trajectory, WeightVersion

Series = dict[int, float]
FIGURES = (
    "rollout/episodes",
    "rollout/reward_mean",
    "rollout/success",
    "rollout/staleness_mean",
    "trainer/loss",
    "perf/publish_to_swap_s",
)


def _trajectory(version: int, n: int, reward: float) -> Trajectory:
    return Trajectory(
        trajectory_id=f"v{version}-{n}",
        group_id=f"g{version}-{n // 4}",
        sample_index=n % 4,
        task_id=f"task{n}",
        task_type="math",
        model_name="policy",
        policy_version=version,
        reward=reward,
        token_ids=np.arange(4, dtype=np.int32),
        loss_mask=np.array([0, 0, 1, 1], np.uint8),
        logprobs=np.array([0, 0, -0.5, -0.5], np.float32),
    )


class _Run:
    """Publishes a run's events phase by phase, waiting for the feed to settle each version."""

    def __init__(self, producer: EventProducer, topics: RunTopics, figures: RunFigures) -> None:
        self.producer, self.topics, self.figures = producer, topics, figures
        self.counts: dict[int, int] = {}

    def episodes(self, version: int, rewards: list[float]) -> None:
        for reward in rewards:
            n = self.counts.get(version, 0)
            self.counts[version] = n + 1
            trajectory = _trajectory(version, n, reward)
            self.producer.publish(self.topics.trajectories, trajectory, key=trajectory.group_id).result(30)
            time.sleep(0.002)  # distinct Kafka timestamps, as a real run has

    def weights(self, version: int, served: list[int] | None = None) -> None:
        figures = {STEP_FIGURE_PREFIX + "loss": repr(1.0 / version), STEP_FIGURE_PREFIX + "seconds": "1.0"}
        event = WeightVersion(model_name="policy", version=version, path="/w", metadata=figures)
        self.producer.publish(self.topics.weights, event, key="policy").result(30)
        if served is not None:  # the server swaps to it a moment later
            time.sleep(0.3)
            served.append(version)
        deadline = time.monotonic() + 60
        while self.figures.newest < version:  # the feed settled it: earlier rows are logged
            assert time.monotonic() < deadline, f"the feed did not settle v{version}"
            time.sleep(0.1)


def _read(bootstrap: str, topic: str) -> list[tuple[Any, int, int, int]]:
    """(event, partition, offset, timestamp) of `topic`, start to end, with no group of its own."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        events, todo = [], {p for p, end in ends.items() if end > 0}
        while todo:
            msg = consumer.poll(10.0)
            assert msg is not None, f"{topic}: partitions {sorted(todo)} not read to their end"
            if msg.error() is None:
                events.append((decode(msg.value()), msg.partition(), msg.offset(), msg.timestamp()[1]))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    todo.discard(msg.partition())
        return events
    finally:
        consumer.close()


def _topic_series(bootstrap: str, topics: RunTopics) -> dict[str, Series]:
    """The figures as the topics have them; staleness as the view computes it."""
    read = [e for e in _read(bootstrap, topics.trajectories) if isinstance(e[0], Trajectory)]
    summaries = [
        TrajectorySummary(p, o, ts, t.trajectory_id, t.task_id, t.task_type, t.model_name, t.policy_version,
                          t.reward, str(t.status), 4, 2, 0, 0, "")
        for t, p, o, ts in read
    ]
    weights = [(w, ts) for w, _, _, ts in _read(bootstrap, topics.weights) if isinstance(w, WeightVersion)]
    lags = staleness_of(summaries, [VersionPoint(w.version, ts) for w, ts in weights])
    by_version: dict[int, list[int]] = {}
    for index, (t, *_) in enumerate(read):
        by_version.setdefault(t.policy_version, []).append(index)
    rewards = {v: [read[k][0].reward for k in ks] for v, ks in by_version.items()}
    return {
        "rollout/episodes": {v: float(len(r)) for v, r in rewards.items()},
        "rollout/reward_mean": {v: statistics.fmean(r) for v, r in rewards.items()},
        "rollout/success": {v: statistics.fmean([x >= 1.0 for x in r]) for v, r in rewards.items()},
        "rollout/staleness_mean": {v: statistics.fmean(lags[k] for k in ks) for v, ks in by_version.items()},
        "trainer/loss": {w.version: float(w.metadata[STEP_FIGURE_PREFIX + "loss"]) for w, _ in weights},
    }


def _tensorboard(folder: Path) -> tuple[dict[str, Series], list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    return {name: {e.step: e.value for e in events.Scalars(name)} for name in FIGURES}, tags  # last per step


def _mlflow(folder: Path, run_id: str) -> tuple[dict[str, Series], list[str]]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    (found,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert found.info.run_name == run_id

    def series(name: str) -> Series:
        history = sorted(client.get_metric_history(found.info.run_id, name), key=lambda m: m.timestamp)
        return {m.step: m.value for m in history}  # the latest value at each step

    return {name: series(name) for name in FIGURES}, list(found.data.metrics)


def _wandb(folder: Path) -> tuple[dict[str, Series], list[str]]:
    (offline,) = offline_runs(folder)
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(offline)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    records = [json.loads(line) for line in done.stdout.splitlines()]
    rows = [r["history"]["item"] for r in records if r.get("type") == "history"]
    series = {name: {int(r["policy_version"]): float(r[name]) for r in rows if name in r} for name in FIGURES}
    return series, sorted({k for r in rows for k in r})


def _metrics_server(metrics: Metrics, served: list[int]) -> tuple[str, uvicorn.Server]:
    """The inference server's `/metrics` and `/get_model_info` (the version it serves: `served[-1]`)."""
    app = FastAPI()
    app.get("/metrics", response_class=PlainTextResponse)(metrics.render)
    app.get("/get_model_info")(lambda: {"weight_version": str(served[-1])})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    return f"http://127.0.0.1:{port}/metrics", server


def test_every_tracker_equals_the_topics_for_every_version_after_stragglers(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    import wandb

    run_id = run_name("stragglers")
    topics = RunTopics.for_run(run_id, fresh=True)
    ensure_topics(kafka_bootstrap, topics.specs())
    metrics = Metrics()
    served = [0]
    url, server = _metrics_server(metrics, served)
    try:
        trackers = open_trackers(
            TrackingConfig.model_validate(["tensorboard", "wandb", "mlflow"]),
            name="stragglers", run_id=run_id, root=tmp_path,
        )
        figures = RunFigures(settle_versions=1)
        config = TrackingFeed.Config(
            bootstrap_servers=kafka_bootstrap,
            topics=[topics.trajectories, topics.batches, topics.weights],
            group_id=tracking_group(run_id),
            model_name="policy",
            endpoints=[MetricsEndpoint("inference", url)],
            model_info_url=url.replace("/metrics", "/get_model_info"),
        )
        feed = TrackingFeed(config, trackers, figures).start()
        with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
            run = _Run(producer, topics, figures)
            run.episodes(0, [1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
            run.weights(1, served)
            run.episodes(1, [1.0, 1.0, 0.0, 1.0])
            run.weights(2, served)  # v0's row is logged now
            run.episodes(0, [0.0, 0.0])  # v0's stragglers
            run.episodes(2, [1.0, 1.0, 1.0, 0.0])
            run.weights(3, served)  # v1's row
            run.episodes(1, [0.0])  # a v1 straggler, 2 versions late
            run.episodes(3, [0.0, 0.0])  # the last version: a tail of 2 late episodes
            metrics.inc("generated_tokens_total", 10)
        feed.finish(drain=True)
        wandb.teardown()  # the W&B service writes the run's file out as it stops
        assert figures.num_revised == 3

        expected = _topic_series(kafka_bootstrap, topics)
        assert sorted(expected["rollout/episodes"]) == [0, 1, 2, 3]
        assert expected["rollout/staleness_mean"][0] > 0  # the stragglers came when v2 was live
        read = {
            "tensorboard": _tensorboard(tmp_path / "tensorboard" / run_id),
            "mlflow": _mlflow(tmp_path / "mlflow", run_id),
            "wandb": _wandb(tmp_path / "wandb"),
        }
        for tracker, (series, names) in read.items():
            for figure, values in expected.items():
                assert series[figure] == pytest.approx(values, rel=1e-6), f"{tracker}: {figure}"
            assert not [n for n in names if n.endswith("_created")], tracker
            assert "inference/running_requests" in names, tracker
            swaps = series["perf/publish_to_swap_s"]  # the server swapped 0.3 s after each publish
            assert sorted(swaps) == [1, 2, 3], (tracker, swaps)
            assert all(0.3 <= delay < 1.5 for delay in swaps.values()), (tracker, swaps)  # polled at 0.25 s
    finally:
        server.should_exit = True
        topic_admin.delete_run(kafka_bootstrap, run_id)
