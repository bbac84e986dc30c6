"""The trainer on a real Kafka topic: killed between steps and restarted, it neither loses nor
repeats a batch; WeightVersions land on the weights topic; replay from an offset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from stacx.producers import EventProducer
from stacx.schemas.records import WeightVersion
from stacx.trainer.testing import synthetic_batches

CHILD = textwrap.dedent("""
    import sys, time
    from stacx.trainer import SourceConfig, StacxTrainer
    from stacx.trainer.testing import tiny_trainer_config

    bootstrap, topic, group, workdir, pause_at = sys.argv[1:6]

    def announce(result):
        print(f"STEP {result.step} {result.batch_id}", flush=True)
        if result.step == int(pause_at):
            time.sleep(600)  # the test kills us here: step trained, not yet checkpointed

    config = tiny_trainer_config("sft", workdir, source=SourceConfig(
        kind="kafka", bootstrap_servers=bootstrap, topic=topic, group_id=group,
        poll_timeout_s=0.5, idle_timeout_s=5.0, session_timeout_ms=6000))
    config.checkpoint.every_steps = 2
    config.export.dir = None  # an exported step is checkpointed first; here only every 2nd step is
    with StacxTrainer(config, on_step=announce) as trainer:
        trainer.run()
    print("DONE", flush=True)
""")


def _child(args: list[str], log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    with log.open("w") as stderr:  # the child keeps its own handle
        return subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env=env)


def _committed(bootstrap: str, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return int(consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        consumer.close()


def test_killed_trainer_neither_loses_nor_repeats_a_batch(
        kafka_bootstrap: str, fresh_topic, fresh_group: str, tmp_path: Path) -> None:
    topic = fresh_topic("batches", partitions=1, config={"max.message.bytes": "8388608"})
    batches = synthetic_batches(5)
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for b in [*batches, batches[1]]:  # batch 1 is re-published (a replayed assembly)
            producer.publish(topic, b, key=b.batch_id).result(timeout=30)

    first = _child([kafka_bootstrap, topic, fresh_group, str(tmp_path), "3"],
                   tmp_path / "first.log")
    assert first.stdout is not None
    seen_first = []
    for line in first.stdout:
        seen_first.append(line.split()[2])
        if line.startswith("STEP 3"):
            break
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert len(seen_first) == 3, (tmp_path / "first.log").read_text()[-3000:]
    assert _committed(kafka_bootstrap, fresh_group, topic) == 2  # checkpoint at step 2 only

    second = _child([kafka_bootstrap, topic, fresh_group, str(tmp_path), "0"],
                    tmp_path / "second.log")
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, (tmp_path / "second.log").read_text()[-3000:]
    seen_second = [line.split()[2] for line in out.splitlines() if line.startswith("STEP")]

    ids = [b.batch_id for b in batches]
    assert seen_first == ids[:3]
    assert seen_second == ids[2:]  # batch 2 re-trained from the step-2 checkpoint, nothing else
    latest = tmp_path / "ckpt" / (tmp_path / "ckpt" / "latest").read_text()
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["trained_batch_ids"] == ids  # each batch exactly once in the final lineage
    assert state["positions"] == {f"{topic}/0": 6}
    assert _committed(kafka_bootstrap, fresh_group, topic) == 6  # duplicate skipped, committed


def test_weight_versions_are_published_and_replay_starts_at_an_offset(
        kafka_bootstrap: str, fresh_topic, fresh_group: str, tmp_path: Path) -> None:
    from stacx.consumers import EventConsumer
    from stacx.trainer import ExportConfig, SourceConfig, StacxTrainer
    from stacx.trainer.testing import tiny_trainer_config

    batch_topic = fresh_topic("batches", partitions=1, config={"max.message.bytes": "8388608"})
    weight_topic = fresh_topic("weights", partitions=1)
    batches = synthetic_batches(3)
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for b in batches:
            producer.publish(batch_topic, b, key=b.batch_id).result(timeout=30)
    config = tiny_trainer_config(
        "grpo", tmp_path,
        source=SourceConfig(kind="kafka", bootstrap_servers=kafka_bootstrap, topic=batch_topic,
                            group_id=fresh_group, replay_from_offset=1, poll_timeout_s=0.5,
                            idle_timeout_s=5.0),
        export=ExportConfig(dir=str(tmp_path / "export"), topic=weight_topic,
                            bootstrap_servers=kafka_bootstrap, model_name="tiny-policy"))
    with StacxTrainer(config) as trainer:
        results = trainer.run()
    assert [r.batch_id for r in results] == [b.batch_id for b in batches[1:]]

    deadline = time.monotonic() + 60
    consumer = EventConsumer(EventConsumer.Config(bootstrap_servers=kafka_bootstrap,
                                                  group_id=fresh_group + "-w", topics=[weight_topic]))
    events = []
    try:
        while len(events) < 2 and time.monotonic() < deadline:
            event = consumer.poll(1.0)
            events += [event] if event is not None else []
        events += [e for e in [consumer.poll(1.0)] if e is not None]  # and nothing more
    finally:
        consumer.close()
    versions = [e.value for e in events]
    assert all(isinstance(v, WeightVersion) for v in versions)
    assert [(v.model_name, v.version) for v in versions] == [("tiny-policy", 1), ("tiny-policy", 2)]
    assert (Path(versions[-1].path) / "model.safetensors").is_file()
    assert events[0].key == "tiny-policy"


def _poll_batch(source, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sourced = source.poll(0.5)
        if sourced is not None:
            return sourced
    raise AssertionError(f"no batch within {timeout_s:.0f}s")


def test_a_commit_refused_after_the_group_evicted_the_trainer_loses_and_repeats_nothing(
        kafka_bootstrap: str, fresh_topic, fresh_group: str, caplog) -> None:
    """A step longer than max.poll.interval (or a session lost while the broker restarts): the
    group evicts the trainer and refuses its next commit. Training goes on, the batches read again
    from the last commit are not handed out twice, and the refused positions are committed once
    the consumer is back in its group (at the latest when it closes)."""
    from stacx.trainer import SourceConfig
    from stacx.trainer.sources import KafkaBatchSource

    topic = fresh_topic("batches", partitions=1, config={"max.message.bytes": "8388608"})
    batches = synthetic_batches(3)
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        for b in batches:
            producer.publish(topic, b, key=b.batch_id).result(timeout=30)
    source = KafkaBatchSource(SourceConfig(
        bootstrap_servers=kafka_bootstrap, topic=topic, group_id=fresh_group,
        session_timeout_ms=6000, max_poll_interval_ms=6000))
    try:
        read = [_poll_batch(source), _poll_batch(source)]
        time.sleep(9)  # one long step: librdkafka leaves the group after 6 s without a read
        source.commit({f"{topic}/0": read[-1].offset + 1})  # refused, and training goes on
        assert "commit refused, the group moved on" in caplog.text
        following = _poll_batch(source)  # back in the group
        assert following.batch.batch_id == batches[2].batch_id, "read again from the last commit"
    finally:
        source.close()
    assert [r.batch.batch_id for r in read] == [b.batch_id for b in batches[:2]]
    assert _committed(kafka_bootstrap, fresh_group, topic) == 2
