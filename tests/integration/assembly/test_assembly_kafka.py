"""The assembler worker on the real broker: exactly the expected batches out.

Covers duplicates (before and after their group closed), a late sample of a timed-out group,
a stale sample, an undecodable event, and a restart that recovers the tables from Kafka.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from assembly_worker import STOPPED_BY_SIGTERM, AssemblerProcess, consume_records
from confluent_kafka import Consumer, Producer, TopicPartition

from stacx.consumers.assembly import batch_id
from stacx.consumers.assembly.testing import make_trajectory
from stacx.schemas.codec import encode
from stacx.schemas.records import DeadLetter, TrainingBatch, Trajectory, WeightVersion
from stacx.schemas.validation import record_problems


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    # lz4, as EventProducer publishes by default: the Faust worker (aiokafka) must read it.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "lz4"}
    )
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def _trajectories(*trajs: Trajectory) -> list[tuple[bytes, bytes]]:
    return [(t.group_id.encode(), encode(t)) for t in trajs]


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{uuid.uuid4().hex}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def _topics(fresh_topic: Callable[..., str], partitions: int) -> dict[str, str]:
    return {
        "trajectories_topic": fresh_topic("asm-traj", partitions=partitions),
        "batches_topic": fresh_topic("asm-batches"),
        "weights_topic": fresh_topic("asm-weights"),
        "dlq_topic": fresh_topic("asm-dlq"),
    }


def _config(bootstrap: str, names: dict[str, str], tmp_path: Path, app_ids: list[str]) -> dict:
    app_ids.append(f"test-asm-{uuid.uuid4().hex[:10]}")
    return {
        "app_id": app_ids[-1],
        "bootstrap_servers": bootstrap,
        "datadir": str(tmp_path / "data"),
        "tick_interval_s": 0.5,
        "grouping": {"group_size": 2, "group_timeout_s": 2.0, "partial_policy": "emit"},
        "mixture": {"batch_size": 2},
        "filtering": {"max_staleness": 2},
        **names,
    }


def _assert_batch(batch: TrainingBatch, members: list[Trajectory]) -> None:
    assert record_problems(batch) == []
    by_id = {t.trajectory_id: t for t in members}
    assert sorted(batch.trajectory_ids) == sorted(by_id)
    assert batch.batch_id == batch_id(list(by_id))
    for i, tid in enumerate(batch.trajectory_ids):
        span = slice(batch.offsets[i], batch.offsets[i] + batch.lengths[i])
        assert np.array_equal(batch.token_ids[span], by_id[tid].token_ids)
        assert np.array_equal(batch.loss_mask[span], by_id[tid].loss_mask)
        assert batch.group_ids[i] == by_id[tid].group_id
        assert batch.rewards[i] == by_id[tid].reward


def test_worker_emits_exactly_the_expected_batches(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str]
) -> None:
    names = _topics(fresh_topic, partitions=4)
    t = functools.partial(make_trajectory, policy_version=5)
    _produce(kafka_bootstrap, names["weights_topic"],
             [(b"policy", encode(WeightVersion(model_name="policy", version=5, path="/w")))])
    with AssemblerProcess(_config(kafka_bootstrap, names, tmp_path, app_ids), tmp_path) as worker:
        worker.wait_for_line("latest weights policy=5")
        # complete groups, one duplicate before its group closed, one undecodable event
        g0 = [t("g0", 0), t("g0", 1)]
        g1 = [t("g1", 0, policy_version=4), t("g1", 1, policy_version=4)]
        _produce(kafka_bootstrap, names["trajectories_topic"],
                 _trajectories(g0[0], g0[0], g0[1], *g1) + [(b"gX", b"\x00junk")])
        (first,) = consume_records(kafka_bootstrap, names["batches_topic"], 1)
        # g2: one stale sample (lag 4 > 2) -> closes at 2 arrivals with 1 trainable;
        # g3: only one sample arrives -> closes on the timeout
        g2_ok, g2_stale, g3_first = t("g2", 0), t("g2", 1, policy_version=1), t("g3", 0)
        _produce(kafka_bootstrap, names["trajectories_topic"],
                 _trajectories(g2_ok, g2_stale, g3_first))
        second = consume_records(kafka_bootstrap, names["batches_topic"], 2)[1]
        # a late sample of g3, a duplicate of closed g0, then two fresh groups
        g4 = [t("g4", 0), t("g4", 1)]
        g5 = [t("g5", 0), t("g5", 1)]
        _produce(kafka_bootstrap, names["trajectories_topic"],
                 _trajectories(t("g3", 1), g0[1], *g4, *g5))
        third = consume_records(kafka_bootstrap, names["batches_topic"], 3)[2]
        code, stats = worker.stop()

    assert code == STOPPED_BY_SIGTERM
    _assert_batch(first[1], g0 + g1)
    _assert_batch(second[1], [g2_ok, g3_first])
    _assert_batch(third[1], g4 + g5)
    assert first[0] == first[1].batch_id.encode()
    assert set(second[1].metadata["partial_groups"].split(",")) == {"g2", "g3"}
    assert _end_offset(kafka_bootstrap, names["batches_topic"]) == 3
    (letter,) = consume_records(kafka_bootstrap, names["dlq_topic"], 1)
    assert isinstance(letter[1], DeadLetter) and letter[1].value == b"\x00junk"
    assert letter[1].source_topic == names["trajectories_topic"]
    assert (stats["duplicates"], stats["late"], stats["stale"], stats["undecodable"]) == (2, 1, 1, 1)
    assert (stats["groups_complete"], stats["groups_timed_out"], stats["batches"]) == (5, 1, 3)


def test_restart_recovers_state_and_replay_rebuilds_the_same_batches(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str]
) -> None:
    names = _topics(fresh_topic, partitions=1)
    config = _config(kafka_bootstrap, names, tmp_path, app_ids)
    # every group completes here: a long timeout keeps a slow (loaded) machine from closing one
    # as partial between its two samples, which is not what this test is about
    config["grouping"]["group_timeout_s"] = 60.0
    groups = {g: [make_trajectory(g, 0), make_trajectory(g, 1)] for g in ("a", "b", "c", "d")}
    _produce(kafka_bootstrap, names["trajectories_topic"],
             _trajectories(*groups["a"], *groups["b"]))
    with AssemblerProcess(config, tmp_path) as worker:
        consume_records(kafka_bootstrap, names["batches_topic"], 1)
        assert worker.stop()[0] == STOPPED_BY_SIGTERM

    # same app id: tables come back from their changelogs, so redelivered samples are dropped
    _produce(kafka_bootstrap, names["trajectories_topic"],
             _trajectories(groups["a"][0], groups["b"][1], *groups["c"], *groups["d"]))
    with AssemblerProcess(config, tmp_path) as worker:
        batches = consume_records(kafka_bootstrap, names["batches_topic"], 2)
        code, stats = worker.stop()
    # at least the two re-sent samples are duplicates; more if the first worker's last offsets
    # were not committed (at-least-once redelivery), which must not change the batches either
    assert code == STOPPED_BY_SIGTERM and stats["duplicates"] >= 2 and stats["batches"] == 1
    _assert_batch(batches[0][1], groups["a"] + groups["b"])
    _assert_batch(batches[1][1], groups["c"] + groups["d"])
    assert _end_offset(kafka_bootstrap, names["batches_topic"]) == 2

    # a fresh worker replaying the whole topic rebuilds the very same batches
    replay_names = {**names, "batches_topic": fresh_topic("asm-replay")}
    replay = _config(kafka_bootstrap, replay_names, tmp_path, app_ids)
    replay["grouping"]["group_timeout_s"] = 60.0
    with AssemblerProcess(replay, tmp_path) as worker:
        replayed = consume_records(kafka_bootstrap, replay_names["batches_topic"], 2)
        assert worker.stop()[0] == STOPPED_BY_SIGTERM
    assert [r[0] for r in replayed] == [b[0] for b in batches]
