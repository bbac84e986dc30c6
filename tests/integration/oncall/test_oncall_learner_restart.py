"""Real Kafka: kill -9 the online learner mid-run, restart it, audit what was trained by id.

Nothing may be lost (every interaction and feedback id of the topic is trained) and nothing
trained twice (each id in exactly one trained batch of the final checkpoint).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from oncall_fixtures import call

from stacx.consumers.oncall import TrajectoryBuilder
from stacx.producers import EventProducer
from stacx.trainer.oncall import audit

NUM_TRAJECTORIES = 24
BATCH = 4
STACX = str(Path(sys.executable).with_name("stacx"))


def _publish(bootstrap: str, topic: str) -> None:
    with EventProducer(EventProducer.Config(bootstrap_servers=bootstrap)) as producer:
        for i in range(NUM_TRAJECTORIES):
            traj, _ = TrajectoryBuilder().add(None, call(f"s{i}", f"c{i}", [257, 40 + i % 9], [50, 258]))
            record = traj.to_trajectory(
                sample_index=0, reward=float(i % 2), rewards={}, metadata={"feedback_ids": f"f{i}"}
            )
            producer.publish(topic, record).result(timeout=30)


def _config(tmp: Path, bootstrap: str, topic: str, weights: str, model_dir: Path) -> Path:
    (tmp / "tasks.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp / "scorer.py").write_text("def score(task, message):\n    return 1.0\n")
    tree = {
        "bootstrap_servers": bootstrap,
        "oncall": {
            "state_dir": str(tmp / "state"),
            "model_name": "restart-test",
            "trajectories_topic": topic,
            "weights_topic": weights,
            "group_id": f"learner-{topic}",
            "readiness": {
                "min_trajectories": BATCH,
                "max_trajectories": BATCH,
                "min_on_timeout": 1,
                "max_wait_s": None,
            },
        },
        "evaluation": {
            "tasks_path": str(tmp / "tasks.jsonl"),
            "scorer": f"{tmp / 'scorer.py'}:score",
            "max_tokens": 4,
        },
        "trainer": {
            "recipe": "grpo",
            "models": {"policy": {"path": str(model_dir)}},
            "role_options": {"policy": {"kl_beta": 0.0}},
            "backend": {"kind": "single", "device": "cpu"},
        },
    }
    path = tmp / "oncall.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _checkpointed_step(state: Path) -> int:
    marker = state / "checkpoints" / "latest"
    return int(marker.read_text().strip().split("_")[-1]) if marker.is_file() else 0


def test_killed_learner_resumes_without_losing_or_repeating_any_event(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    topic = fresh_topic("oncall-trajectories", partitions=1)
    weights = fresh_topic("weights", partitions=1)
    _publish(kafka_bootstrap, topic)
    config = _config(tmp_path, kafka_bootstrap, topic, weights, tiny_model_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "learner.log").open("wb")
    first = subprocess.Popen([STACX, "oncall", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while _checkpointed_step(tmp_path / "state") < 2:
        assert first.poll() is None, (tmp_path / "learner.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the learner did not checkpoint 2 steps in 300 s"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # mid-run: between steps or inside one
    first.wait(timeout=30)
    killed_at = _checkpointed_step(tmp_path / "state")
    assert killed_at < NUM_TRAJECTORIES // BATCH

    second = subprocess.run(
        [STACX, "oncall", str(config), "--max-steps", str(NUM_TRAJECTORIES // BATCH)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        timeout=300,
    )
    assert second.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]

    trained = audit(tmp_path / "state")
    assert trained["steps"] == NUM_TRAJECTORIES // BATCH
    assert trained["interaction_ids"] == sorted(f"c{i}" for i in range(NUM_TRAJECTORIES))
    assert trained["feedback_ids"] == sorted(f"f{i}" for i in range(NUM_TRAJECTORIES))
    assert trained["interaction_ids_twice"] == [] and trained["feedback_ids_twice"] == []
    assert trained["trajectory_ids_twice"] == []
