"""Real Kafka: kill -9 the join worker (`stacx oncall-join`) while it reads the calls, start
another, then send the feedback: every session is joined with each of its calls once.

The killed worker leaves calls read but not committed and a table changelog partly written; the
next one rebuilds the table and reads those calls again, and must not add a turn twice.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from oncall_fixtures import call, committed, join_config, join_worker, rating, wait_committed

from stacx.consumers import EventConsumer
from stacx.producers import EventProducer
from stacx.schemas.records import Trajectory, now_ms

STACX = str(Path(sys.executable).with_name("stacx"))
SESSIONS = 24


class _Ends:
    """The end offsets of a topic's partitions, summed: records written so far."""

    def __init__(self, bootstrap: str, topic: str, *, partitions: int) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4().hex[:8]}"})
        self.topic, self.partitions = topic, partitions

    def total(self) -> int:
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        return sum(self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps)

    def close(self) -> None:
        self.consumer.close()


def _joined(bootstrap: str, topic: str, timeout_s: float = 180) -> dict[str, list[Trajectory]]:
    """Trajectories by session, read until every session has one (or the timeout)."""
    group = f"read-{uuid.uuid4().hex[:8]}"
    config = EventConsumer.Config(bootstrap_servers=bootstrap, topics=[topic], group_id=group)
    consumer = EventConsumer(config)
    by_session: dict[str, list[Trajectory]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(by_session) < SESSIONS and time.monotonic() < deadline:
            for event in consumer.consume(100, 1.0):
                assert isinstance(event.value, Trajectory)
                by_session.setdefault(event.value.group_id, []).append(event.value)
    finally:
        consumer.close()
    return by_session


def test_a_killed_join_worker_is_replaced_and_joins_every_call_once(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str]
) -> None:
    config, names = join_config(kafka_bootstrap, fresh_topic, tmp_path, app_ids, window_s=600.0)
    logs, feedback, out = names["agent_logs_topic"], names["feedback_topic"], names["trajectories_topic"]
    app_id = names["app_id"]
    log = tmp_path / "join.log"
    t0 = now_ms()
    first = join_worker(config, log)
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for i in range(SESSIONS):  # a first call per session, read and committed
            producer.publish(logs, call(f"s{i}", f"a{i}", [1, i], [3], at_ms=t0))
        producer.flush(30)
        wait_committed(kafka_bootstrap, app_id, logs, SESSIONS)
        changelog = _Ends(kafka_bootstrap, f"{app_id}-sessions-changelog", partitions=2)
        written = changelog.total()
        for i in range(SESSIONS):  # a second call extending the first: the same trajectory
            producer.publish(logs, call(f"s{i}", f"b{i}", [1, i, 3, 9], [4], at_ms=t0 + 1))
        producer.flush(30)
        # kill once the table holds the second calls, before their offsets are committed (Faust
        # commits every 2.8 s): the next worker reads them again over a table that has them
        while changelog.total() < written + SESSIONS:
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        changelog.close()
        redelivered = 2 * SESSIONS - committed(kafka_bootstrap, app_id, logs)
        second = join_worker(config, log)
        try:
            wait_committed(kafka_bootstrap, app_id, logs, 2 * SESSIONS)
            for i in range(SESSIONS):
                producer.publish(feedback, rating(f"s{i}", float(i % 2), at_ms=t0 + 2_000))
            producer.flush(30)
            by_session = _joined(kafka_bootstrap, out)
        finally:
            second.terminate()
            second.wait(timeout=60)
    log_tail = log.read_text()[-3000:]
    assert redelivered > 0, "the kill came after the commit: nothing was read twice"
    assert sorted(by_session) == sorted(f"s{i}" for i in range(SESSIONS)), log_tail
    for i in range(SESSIONS):
        trajectories = by_session[f"s{i}"]
        assert len({t.trajectory_id for t in trajectories}) == 1, trajectories  # a re-send keeps its id
        trajectory = trajectories[0]
        assert trajectory.metadata["interaction_ids"] == f"a{i},b{i}", trajectory.metadata
        assert list(trajectory.token_ids) == [1, i, 3, 9, 4] and list(trajectory.loss_mask) == [0, 0, 1, 0, 1]
        assert trajectory.reward == float(i % 2)
