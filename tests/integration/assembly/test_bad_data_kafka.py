"""Bad data never blocks the loop: the real assembler worker and the real trainer on the broker.

A NaN reward written past the producer's check (an older or foreign writer) is dead-lettered by
the assembler; a NaN batch written straight to the batches topic is dead-lettered by the trainer,
which trains the batches before and after it. Both dead letters keep the original headers. A
compatible newer `Trajectory` (its schema only in the catalogue) and a record keyed like the
assembler's ticks are assembled like any other.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import fastavro
import numpy as np
import pytest
from assembly_worker import STOPPED_BY_SIGTERM, AssemblerProcess, consume_records, one_group_config
from confluent_kafka import Consumer, TopicPartition

from stacx.consumers.assembly import TICK_KEY
from stacx.consumers.assembly.testing import make_trajectory
from stacx.producers import EventProducer
from stacx.schemas.catalogue import SchemaCatalogue
from stacx.schemas.codec import SINGLE_OBJECT_MARKER, Codec, load_schema
from stacx.schemas.errors import RecordValidationError
from stacx.schemas.records import DeadLetter, TrainingBatch, Trajectory, token_ids
from stacx.trainer import SourceConfig, StacxTrainer
from stacx.trainer.testing import tiny_trainer_config


def _sample(group: str, index: int, **fields: object) -> Trajectory:
    """A trajectory whose token ids fit the tiny trainer model (vocabulary 64)."""
    traj = make_trajectory(group, index, num_prompt=4, num_completion=4)
    traj.token_ids = token_ids(traj.token_ids % 60 + 1)
    for name, value in fields.items():
        setattr(traj, name, value)
    return traj


def _newer_schema_event(traj: Trajectory, catalogue: SchemaCatalogue) -> bytes:
    """`traj` as a newer producer writes it: one more field (with a default), schema registered."""
    current = Codec().local_schema(Trajectory)
    datum = fastavro.schemaless_reader(io.BytesIO(Codec().encode(traj)[10:]), current.parsed, None)
    extra = {"name": "origin", "type": "string", "default": ""}
    newer = load_schema({**current.schema, "fields": [*current.schema["fields"], extra]})
    catalogue.register(newer)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, newer.parsed, {**datum, "origin": "canary"})
    return SINGLE_OBJECT_MARKER + bytes.fromhex(newer.fingerprint) + body.getvalue()


def _nan_batch(template: TrainingBatch) -> TrainingBatch:
    rewards = template.rewards.copy()
    rewards[0] = np.nan
    template.batch_id, template.rewards = "nan-batch", rewards
    return template


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return int(consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        consumer.close()


def test_nan_reward_and_nan_batch_are_dead_lettered_and_training_continues(
    kafka_bootstrap: str,
    fresh_topic: Callable[..., str],
    fresh_group: str,
    tmp_path: Path,
    app_ids: list[str],
) -> None:
    config = one_group_config(fresh_topic, kafka_bootstrap, tmp_path, "bad", partitions=2)
    app_ids.append(config["app_id"])
    trajectories, batches, dlq = config["trajectories_topic"], config["batches_topic"], config["dlq_topic"]
    producer = EventProducer(
        EventProducer.Config(bootstrap_servers=kafka_bootstrap, schemas_topic=config["schemas_topic"])
    )
    catalogue = SchemaCatalogue(
        SchemaCatalogue.Config(bootstrap_servers=kafka_bootstrap, topic=config["schemas_topic"])
    )
    with producer, AssemblerProcess(config, tmp_path) as worker:
        for traj in (_sample("g0", 0), _sample("g0", 1)):
            producer.publish(trajectories, traj, headers={"origin": "rollout"})
        nan_traj = _sample("g-bad", 0, reward=float("nan"))
        with pytest.raises(RecordValidationError, match="reward must be finite"):
            producer.publish(trajectories, nan_traj)  # stopped where it is made...
        producer.publish_bytes(
            trajectories, producer.codec.encode(nan_traj), key=b"g-bad", headers={"origin": "nan-writer"}
        )  # ...unless a writer skips it
        producer.flush(30)
        (first,) = consume_records(kafka_bootstrap, batches, 1)
        bad_batch = _nan_batch(first[1])
        producer.publish_bytes(
            batches, producer.codec.encode(bad_batch), key=b"nan-batch", headers={"origin": "old-assembler"}
        )
        producer.publish(trajectories, _sample("g2", 0))
        producer.publish_bytes(trajectories, _newer_schema_event(_sample("g2", 1), catalogue), key=b"g2")
        for traj in (_sample("g3", 0), _sample("g3", 1)):
            producer.publish(trajectories, traj, key=TICK_KEY)
        producer.flush(30)
        records = consume_records(kafka_bootstrap, batches, 4, idle_s=2.0)
        code, stats = worker.stop()
    catalogue.close()
    assert code == STOPPED_BY_SIGTERM and stats["undecodable"] == 1 and stats["batches"] == 3
    order = [value.batch_id for _key, value, _ts in records]
    assert len(order) == 4 and order[1] == "nan-batch"  # B0, the bad batch, then B2 and B3

    config_t = tiny_trainer_config(
        "grpo",
        tmp_path / "trainer",
        source=SourceConfig(
            kind="kafka",
            bootstrap_servers=kafka_bootstrap,
            topic=batches,
            group_id=fresh_group,
            dlq_topic=dlq,
            poll_timeout_s=0.5,
            idle_timeout_s=6.0,
        ),
    )
    with StacxTrainer(config_t) as trainer:
        results = trainer.run()
        assert trainer.source is not None and trainer.source.num_dead_letters == 1  # type: ignore[attr-defined]
    assert [r.batch_id for r in results] == [order[0], order[2], order[3]]
    assert all(np.isfinite(r.loss) for r in results)
    assert _committed(kafka_bootstrap, fresh_group, batches) == 4  # past the bad batch too

    letters = [value for _key, value, _ts in consume_records(kafka_bootstrap, dlq, 2, idle_s=2.0)]
    assert all(isinstance(letter, DeadLetter) for letter in letters) and len(letters) == 2
    by_topic = {letter.source_topic: letter for letter in letters}
    from_assembler, from_trainer = by_topic[trajectories], by_topic[batches]
    assert "reward must be finite" in from_assembler.reason
    assert from_assembler.headers["origin"] == "nan-writer" and from_assembler.key == b"g-bad"
    assert from_trainer.error_type == "RecordValidationError"
    assert "rewards must be finite" in from_trainer.reason and from_trainer.source_offset == 1
    assert from_trainer.headers["origin"] == "old-assembler" and from_trainer.key == b"nan-batch"
