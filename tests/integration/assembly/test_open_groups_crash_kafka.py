"""Open groups live in the worker's memory, the trajectories topic is their changelog: a
`stacx assemble` worker killed with -9 while groups are half full loses none of them.

The committed offset must stop at the first sample of the oldest open group of each partition;
the restarted worker reads again from there, rebuilds the open groups from the redelivered
samples and emits every group exactly once, with all its samples.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from assembly_worker import STOPPED_BY_SIGTERM, AssemblerProcess, consume_records, one_group_config
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from stacx.consumers.assembly.testing import make_trajectory
from stacx.schemas.codec import encode
from stacx.schemas.records import TrainingBatch, Trajectory

GROUP_SIZE = 4


def _produce(bootstrap: str, topic: str, trajs: list[Trajectory]) -> dict[str, tuple[int, int]]:
    """Write `trajs` in order; returns trajectory id -> (partition, offset)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "lz4"}
    )
    placed: dict[str, tuple[int, int]] = {}
    for traj in trajs:

        def on_delivery(err: object, msg: object, tid: str = traj.trajectory_id) -> None:
            assert err is None, err
            placed[tid] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

        producer.produce(topic, key=traj.group_id.encode(), value=encode(traj), on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return placed


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Committed offsets of the worker's consumer group on `topic` (partitions without one left out)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    answer = admin.list_consumer_group_offsets([request])[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in answer.topic_partitions if tp.offset >= 0}


def test_a_killed_worker_loses_no_half_full_group_and_emits_none_twice(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str]
) -> None:
    config = one_group_config(fresh_topic, kafka_bootstrap, tmp_path, "crash", partitions=2)
    config["grouping"] = {"group_size": GROUP_SIZE, "group_timeout_s": 600.0}
    app_ids.append(config["app_id"])
    topic = config["trajectories_topic"]
    samples = {g: [make_trajectory(g, i) for i in range(GROUP_SIZE)] for g in (f"g{n}" for n in range(10))}
    before = ["g0", "g1"]  # complete before the open ones: the committed offset passes them
    half_full = ["g2", "g3", "g4", "g5", "g6", "g7"]
    after = ["g8", "g9"]  # complete, written after the open groups' first halves
    first_halves = [t for g in half_full for t in samples[g][: GROUP_SIZE // 2]]
    placed = _produce(kafka_bootstrap, topic, [t for g in before for t in samples[g]] + first_halves)
    placed |= _produce(kafka_bootstrap, topic, [t for g in after for t in samples[g]])

    with AssemblerProcess(config, tmp_path) as worker:
        consume_records(kafka_bootstrap, config["batches_topic"], len(before) + len(after))
        time.sleep(6.0)  # a few commit intervals (2.8 s) pass with the groups still open
        committed = _committed(kafka_bootstrap, config["app_id"], topic, partitions=2)
        worker.proc.kill()  # SIGKILL: no shutdown, no last commit
        worker.proc.wait()

    first_open: dict[int, int] = {}
    for traj in first_halves:
        partition, offset = placed[traj.trajectory_id]
        first_open[partition] = min(offset, first_open.get(partition, offset))
    assert committed, "the worker committed nothing in 6 s"
    for partition, offset in committed.items():
        assert offset <= first_open[partition], f"partition {partition}: committed past an open group"

    second_halves = [t for g in half_full for t in samples[g][GROUP_SIZE // 2 :]]
    _produce(kafka_bootstrap, topic, second_halves)
    with AssemblerProcess(config, tmp_path / "restarted") as worker:
        records = consume_records(kafka_bootstrap, config["batches_topic"], len(samples), idle_s=5.0)
        code, stats = worker.stop()

    assert code == STOPPED_BY_SIGTERM
    batches = [r[1] for r in records]
    assert all(isinstance(b, TrainingBatch) for b in batches)
    emitted = Counter(g for b in batches for g in set(b.group_ids))
    assert emitted == Counter(set(samples)), f"groups emitted not exactly once: {emitted}"
    for batch in batches:
        (group_id,) = set(batch.group_ids)
        assert sorted(batch.trajectory_ids) == sorted(t.trajectory_id for t in samples[group_id])
    assert stats["groups_timed_out"] == 0 and stats["late"] == 0
    assert len({b.batch_id for b in batches}) == len(samples) == len(batches)
