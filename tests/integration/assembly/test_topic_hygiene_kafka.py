"""Topic hygiene, checked from the outside with Kafka's own tools on a broker configured like
`stacx infra up`'s: `auto.create.topics.enable=false`.

On a private broker (its own ports and data under tmp, the installed jars), the standard and
per-run topics are created explicitly, the Faust assembler runs and writes a batch (so every
topic it needs, its internal ones included, was created on purpose), `kafka-transactions
describe-producers` shows the producer id of its idempotent writes on the batches topic, and
`kafka-consumer-groups` lists the assembler, the weight subscriber and the rollout weights
follower in named groups with committed offsets.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from assembly_worker import STOPPED_BY_SIGTERM, AssemblerProcess, consume_records
from confluent_kafka import Consumer, Producer
from run_names import run_name

from stacx.consumers.assembly.testing import make_trajectory
from stacx.consumers.weights import WeightSubscriber, subscriber_group
from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.services import kafka, kafka_tools
from stacx.infra.services.topics import ensure_topics
from stacx.rollout.adapters import WeightsFollower
from stacx.schemas.codec import encode
from stacx.schemas.records import TrainingBatch, WeightVersion

PORT = int(os.environ.get("STACX_TEST_PRIVATE_KAFKA_PORT", "19392"))


@pytest.fixture(scope="module")
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A broker started by `stacx.infra.services.kafka.up` under a private STACX_HOME (jars shared)."""
    jars = kafka.jar_dir()
    if not any(jars.glob("kafka_*.jar")):
        pytest.fail(f"no Kafka jars in {jars}: run `.venv/bin/stacx infra up` once", pytrace=False)
    home = tmp_path_factory.mktemp("stacx-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STACX_HOME", str(home))
        private_jars = kafka.jar_dir()
        private_jars.parent.mkdir(parents=True)
        private_jars.symlink_to(jars)
        config = kafka.KafkaConfig(port=PORT, controller_port=PORT + 1, heap="512m")
        kafka.up(config)
        try:
            props = (home / "kafka" / "server.properties").read_text()
            assert "auto.create.topics.enable=false" in props
            yield config.bootstrap, home / "kafka" / "data"
        finally:
            kafka.down()


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "lz4"}
    )
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def _subscribe_weights(bootstrap: str, topic: str) -> tuple[str, str]:
    """A weight subscriber and a rollout weights follower read the topic and commit; their groups."""
    subscriber = WeightSubscriber(
        WeightSubscriber.Config(
            model_name="policy", server_url="http://127.0.0.1:1", bootstrap_servers=bootstrap, topic=topic
        )
    )
    follower = WeightsFollower(
        "critic", bootstrap_servers=bootstrap, topic=topic, group_id="stacx-test-follower"
    )
    try:
        subscriber.catch_up()  # reads the critic's version (not its model: nothing to load) and commits
        assert follower.wait_caught_up(60)
        deadline = time.monotonic() + 30
        while follower.current() != 7 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert follower.current() == 7
    finally:
        subscriber.close()
        follower.close()
    return subscriber_group("policy", "http://127.0.0.1:1", topic), follower.group_id


def test_idempotent_batches_named_groups_and_no_auto_created_topics(
    private_broker: tuple[str, Path], tmp_path: Path
) -> None:
    bootstrap, data_dir = private_broker
    ensure_topics(bootstrap)  # what `stacx infra up` does
    run = RunTopics.for_run(run_name("hygiene"), fresh=True)
    ensure_topics(bootstrap, run.specs())
    app_id = f"stacx-assembler-{uuid.uuid4().hex[:6]}"
    config = {
        "app_id": app_id,
        "bootstrap_servers": bootstrap,
        "trajectories_topic": run.trajectories,
        "batches_topic": run.batches,
        "weights_topic": run.weights,
        "datadir": str(tmp_path / "data"),
        "tick_interval_s": 0.5,
        "grouping": {"group_size": 2, "group_timeout_s": 30.0},
        "mixture": {"batch_size": 1},
    }
    _produce(
        bootstrap,
        run.weights,
        [(b"critic", encode(WeightVersion(model_name="critic", version=7, path="/c")))],
    )
    with AssemblerProcess(config, tmp_path) as worker:
        worker.wait_for_line("latest weights critic=7", timeout_s=180)
        group = [make_trajectory("g0", 0), make_trajectory("g0", 1)]
        _produce(bootstrap, run.trajectories, [(t.group_id.encode(), encode(t)) for t in group])
        try:
            ((key, batch, _),) = consume_records(bootstrap, run.batches, 1, timeout_s=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; assembler log tail:\n" + "\n".join(worker.lines[-40:])) from None
        code, stats = worker.stop()
    assert code == STOPPED_BY_SIGTERM and stats["batches"] == 1
    assert isinstance(batch, TrainingBatch) and key == batch.batch_id.encode()

    producers = kafka_tools.describe_producers(bootstrap, run.batches)
    assert producers and all(int(p["ProducerId"]) >= 0 for p in producers), producers
    (segment,) = (data_dir / f"{run.batches}-0").glob("*.log")
    dumped = kafka_tools.run_tool(kafka_tools.DUMP_LOG, "--files", str(segment))
    batch_line = next(line for line in dumped.splitlines() if line.startswith("baseOffset"))
    assert f"producerId: {producers[0]['ProducerId']}" in batch_line, batch_line
    assert "compresscodec: lz4" in batch_line.lower(), batch_line  # stored as the producer wrote it

    subscriber_group, follower_group = _subscribe_weights(bootstrap, run.weights)
    listed = kafka_tools.consumer_groups(bootstrap)
    assert {app_id, subscriber_group, follower_group} <= set(listed), listed
    rows = kafka_tools.describe_groups(bootstrap, [subscriber_group, follower_group])
    assert {(r["GROUP"], r["TOPIC"], r["CURRENT-OFFSET"], r["LAG"]) for r in rows} == {
        (subscriber_group, run.weights, "1", "0"),
        (follower_group, run.weights, "1", "0"),
    }

    # a mistyped topic name is not created by reading it
    typo = f"{run.weights}-typo"
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"typo-{uuid.uuid4().hex[:6]}"})
    reader.subscribe([typo])
    reader.poll(3.0)
    reader.close()
    assert (
        typo not in Consumer({"bootstrap.servers": bootstrap, "group.id": "x"}).list_topics(timeout=10).topics
    )
