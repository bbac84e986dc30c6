"""Real Kafka: the join worker (`stacx oncall-join`) turns calls + feedback into rewarded
trajectories and dead-letters late feedback with the reason."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncall_fixtures import call, join_config, join_worker, rating, wait_committed

from stacx.consumers import EventConsumer
from stacx.producers import EventProducer
from stacx.schemas.records import DeadLetter, Trajectory, now_ms

STACX = str(Path(sys.executable).with_name("stacx"))


def _read(bootstrap: str, topics: list[str], count: int, timeout_s: float = 120) -> list[Any]:
    consumer = EventConsumer(
        EventConsumer.Config(
            bootstrap_servers=bootstrap, topics=topics, group_id=f"read-{uuid.uuid4().hex[:8]}"
        )
    )
    events: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(events) < count and time.monotonic() < deadline:
            events += consumer.consume(100, 1.0)
    finally:
        consumer.close()
    return events


def test_join_worker_emits_rewarded_trajectories_and_dead_letters_late_feedback(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str]
) -> None:
    config, names = join_config(kafka_bootstrap, fresh_topic, tmp_path, app_ids, window_s=60.0)
    logs, feedback, out = names["agent_logs_topic"], names["feedback_topic"], names["trajectories_topic"]
    dlq, app_id = names["dlq_topic"], names["app_id"]
    worker = join_worker(config, tmp_path / "join.log")
    try:
        t0 = now_ms()
        with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
            producer.publish(logs, call("s1", "a", [1, 2], [3], at_ms=t0))
            producer.publish(logs, call("s1", "b", [1, 2, 3, 9], [4], at_ms=t0 + 1))  # merged
            producer.publish(logs, call("s2", "c", [5], [6], at_ms=t0))
            producer.flush(30)
            # feedback comes after the calls (seconds later, as from users): both topics are read
            # at once, so wait until the worker has consumed the calls
            wait_committed(kafka_bootstrap, app_id, logs, 3)
            producer.publish(feedback, rating("s1", 1.0, at_ms=t0 + 2_000))
            producer.publish(feedback, rating("s2", 1.0, at_ms=t0 + 61_000))  # after the window
            producer.flush(30)
        joined = _read(kafka_bootstrap, [out], 1)
        letters = _read(kafka_bootstrap, [dlq], 1)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    log_tail = (tmp_path / "join.log").read_text()[-3000:]
    assert worker.returncode == 143, log_tail  # docs/operations.md: 128 + SIGTERM, and one line
    assert "stacx oncall-join: stopped by SIGTERM" in log_tail
    assert len(joined) == 1, log_tail
    trajectory = joined[0].value
    assert isinstance(trajectory, Trajectory) and trajectory.reward == 1.0
    assert trajectory.metadata["interaction_ids"] == "a,b"
    assert list(trajectory.token_ids) == [1, 2, 3, 9, 4] and list(trajectory.loss_mask) == [0, 0, 1, 0, 1]
    (letter,) = [e.value for e in letters]
    assert isinstance(letter, DeadLetter) and letter.error_type == "LateFeedback"
    assert letter.source_topic == feedback
