"""`stacx topics list | describe | gc --run` on the real broker: a run's topics, its groups'
lag, and the deletion of the run's topics (Faust internals included) and groups."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from run_names import run_name

from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.services.topics import ensure_topics

REPO = Path(__file__).resolve().parents[3]


def _stacx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stacx.infra.cli", "topics", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_list_describe_and_delete_a_finished_run(kafka_bootstrap: str) -> None:
    run_id = run_name("topics-cli")
    run = RunTopics.for_run(run_id, fresh=True)
    ensure_topics(kafka_bootstrap, run.specs())
    internal = f"stacx-assembler-{run_id}-ticks"  # a Faust worker's own topic
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(internal, num_partitions=1, replication_factor=1)])[internal].result(30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        producer.produce(run.batches, key=str(i).encode(), value=b"x" * 100)
    assert producer.flush(30) == 0
    group = f"stacx-trainer-{run_id}"
    reader = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    )
    reader.subscribe([run.batches])
    read = 0
    while read < 2:
        msg = reader.poll(1.0)
        if msg is not None and not msg.error():
            read += 1
            reader.commit(message=msg, asynchronous=False)
    reader.close()
    common = ["--bootstrap", kafka_bootstrap]

    listed = _stacx("list", "--json", *common)
    assert listed.returncode == 0, listed.stderr
    (mine,) = [r for r in json.loads(listed.stdout)["runs"] if r["run"] == run_id]
    assert {t["name"] for t in mine["topics"]} == {*(t.name for t in run.specs()), internal}
    assert mine["records"] == 5 and mine["size_bytes"] > 500

    described = _stacx("describe", run_id, "--json", "--no-sizes", *common)
    assert described.returncode == 0, described.stderr
    (lag,) = [g for g in json.loads(described.stdout)["lag"] if g["group"] == group]
    assert (lag["topic"], lag["committed"], lag["end"], lag["lag"]) == (run.batches, 2, 5, 3)

    deleted = _stacx("gc", "--run", run_id, "--json", *common)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    report = json.loads(deleted.stdout.splitlines()[0])
    assert internal in report["topics"] and group in report["groups"]
    remaining = set(admin.list_topics(timeout=10).topics)
    assert not {internal, *(t.name for t in run.specs())} & remaining
    groups = {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result().valid}
    assert group not in groups
