"""Acceptance: a short real pipeline with `tracking: [tensorboard, wandb, mlflow]`, read back with
each tool's own reader (TensorBoard's EventAccumulator, the offline W&B run's records and
`wandb sync --dry-run`, MLflow's client), holds the same per-version reward and loss series as the
run's own topics.

Kafka, Docker and the sandbox image must be up (`stacx infra up`; `make test` does it).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from small_runs import shrink
from wandb_records import history, offline_runs

from stacx.infra.pipeline import load_spec, run_pipeline
from stacx.infra.tracking import TrackingConfig
from stacx.schemas.codec import decode
from stacx.schemas.records import STEP_FIGURE_PREFIX, Trajectory, WeightVersion

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
Series = dict[int, float]
FIGURES = ("rollout/reward_mean", "rollout/episodes", "trainer/loss", "trainer/num_tokens")
"""Compared with the topics: the reward and loss series, and two that a short run never leaves at 0."""


def _small(spec: Any, runs_dir: Path) -> Any:
    cfg = spec.pipeline
    cfg.tasks.options.update(num_train=64, num_heldout=8)
    cfg.sft.steps, cfg.sft.batch_size = 10, 16
    cfg.evaluation.every_versions = 0
    cfg.tracking = TrackingConfig.model_validate(["tensorboard", "wandb", "mlflow"])
    return shrink(
        spec,
        runs_dir,
        steps=STEPS,
        timeout_s=540.0,
        samples_per_task=4,
        max_concurrent_episodes=16,
        group_size=4,
    )


def _read(bootstrap: str, topic: str) -> list[Any]:
    """Every event of `topic`, start to end, without a consumer group of its own."""
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
                events.append(decode(msg.value()))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    todo.discard(msg.partition())
        return events
    finally:
        consumer.close()


def _topic_series(bootstrap: str, topics: dict[str, str]) -> dict[str, Series]:
    """The figures as the run's topics have them: per generating version, the mean reward and
    the number of episodes; per published version, the trainer's loss and tokens."""
    episodes = {
        t.trajectory_id: t for t in _read(bootstrap, topics["trajectories"]) if isinstance(t, Trajectory)
    }
    by_version: dict[int, list[float]] = {}
    for t in episodes.values():
        by_version.setdefault(t.policy_version, []).append(t.reward)
    weights = [w for w in _read(bootstrap, topics["weights"]) if isinstance(w, WeightVersion)]
    return {
        "rollout/reward_mean": {v: statistics.fmean(r) for v, r in by_version.items()},
        "rollout/episodes": {v: float(len(r)) for v, r in by_version.items()},
        "trainer/loss": {w.version: float(w.metadata[STEP_FIGURE_PREFIX + "loss"]) for w in weights},
        "trainer/num_tokens": {
            w.version: float(w.metadata[STEP_FIGURE_PREFIX + "num_tokens"]) for w in weights
        },
    }


def _tensorboard(folder: Path) -> dict[str, Series]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    junk = [tag for tag in events.Tags()["scalars"] if tag.endswith("_created")]
    assert not junk, f"Prometheus creation timestamps logged as figures: {junk}"
    return {name: {e.step: e.value for e in events.Scalars(name)} for name in FIGURES}  # last per step


def _wandb(folder: Path) -> dict[str, Series]:
    (run,) = offline_runs(folder)
    sync = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "Would sync 1 run(s)" in sync.stdout + sync.stderr
    rows = history(run)
    return {name: {r["policy_version"]: float(r[name]) for r in rows if name in r} for name in FIGURES}


def _mlflow(folder: Path, run_id: str) -> dict[str, Series]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    (found,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert found.info.run_name == run_id and found.info.status == "FINISHED"
    def latest(name: str) -> Series:  # a revised row is the latest value at its step
        history = sorted(client.get_metric_history(found.info.run_id, name), key=lambda m: m.timestamp)
        return {m.step: m.value for m in history}

    assert "trainer.optimizer.max_grad_norm" in " ".join(found.data.params)  # the resolved config
    return {name: latest(name) for name in FIGURES}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_tracker_holds_the_runs_reward_and_loss_series(
    kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path
) -> None:
    spec = _small(load_spec(REPO / "examples" / "quickstart.yaml"), tmp_path)
    spec.bootstrap_servers = kafka_bootstrap
    report = run_pipeline(spec)
    assert report["status"] == "ok", report["error"]

    root = tmp_path / spec.pipeline.name / "tracking"
    assert report["tracking"] == {name: str(root / name) for name in ("tensorboard", "wandb", "mlflow")}
    expected = _topic_series(kafka_bootstrap, report["topics"])
    assert sorted(expected["trainer/loss"]) == list(range(1, report["policy_versions"] + 1))
    assert 0 in expected["rollout/reward_mean"]

    for name, tracked in {
        "tensorboard": _tensorboard(root / "tensorboard" / report["run_id"]),  # float32 event values
        "wandb": _wandb(root / "wandb"),
        "mlflow": _mlflow(root / "mlflow", report["run_id"]),
    }.items():
        for figure, series in expected.items():
            assert tracked[figure] == pytest.approx(series, rel=1e-6), f"{name}: {figure}"
