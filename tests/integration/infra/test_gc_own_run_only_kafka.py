"""`stacx topics describe | gc --run` touch only the run they name, on the real broker: another
run's inference server (its weight subscriber, on the same port) keeps its group and offsets;
a run's groups without committed offsets are found; a deleted run's blobs go with its topics,
and a topic that was deleted or emptied by retention no longer holds its orphan blobs back."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from idle_groups import assert_describe_finds_idle_group
from run_names import run_name

from stacx.consumers.blob_gc import referenced_in_topic
from stacx.consumers.weights import WeightSubscriber, subscriber_group
from stacx.infra.cli import main
from stacx.infra.pipeline.layout import RunTopics
from stacx.infra.services import topic_admin
from stacx.infra.services.topics import ensure_topics
from stacx.producers.blobs import FsspecBlobStore
from stacx.schemas.codec import encode
from stacx.schemas.records import WeightVersion

SERVER = "http://127.0.0.1:30010"  # both runs' servers on the same port (one after the other)


def _run(kafka_bootstrap: str, stem: str) -> tuple[str, RunTopics]:
    run_id = run_name(stem)
    run = RunTopics.for_run(run_id, fresh=True)
    ensure_topics(kafka_bootstrap, run.specs())
    return run_id, run


def _announce(bootstrap: str, topic: str) -> None:
    """A version of another model: the subscriber reads it, ignores it, and commits."""
    producer = Producer({"bootstrap.servers": bootstrap})
    version = WeightVersion(model_name="critic", version=1, path="/c")
    producer.produce(topic, key=b"critic", value=encode(version))
    assert producer.flush(30) == 0


def _subscriber(bootstrap: str, topic: str) -> WeightSubscriber:
    subscriber = WeightSubscriber(
        WeightSubscriber.Config(
            model_name="policy", server_url=SERVER, bootstrap_servers=bootstrap, topic=topic
        )
    )
    subscriber.catch_up()
    return subscriber


def _groups(admin: AdminClient) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result(timeout=60).valid}


def test_gc_of_a_finished_run_leaves_another_runs_server_alone(kafka_bootstrap: str) -> None:
    (done_id, done), (live_id, live) = _run(kafka_bootstrap, "done"), _run(kafka_bootstrap, "live")
    for run in (done, live):
        _announce(kafka_bootstrap, run.weights)
    _subscriber(kafka_bootstrap, done.weights).close()  # the finished run's server, stopped
    serving = _subscriber(kafka_bootstrap, live.weights)  # the other run's server, still up
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    try:
        theirs = subscriber_group("policy", SERVER, live.weights)
        assert live_id in theirs and subscriber_group("policy", SERVER, done.weights) != theirs
        _, groups = topic_admin.delete_run(kafka_bootstrap, done_id)
        assert theirs not in groups
        assert theirs in _groups(admin)
        offsets = admin.list_consumer_group_offsets([_group_partitions(theirs, live.weights)])
        (tp,) = offsets[theirs].result(timeout=60).topic_partitions
        assert tp.offset == 1  # the other run's committed position is still there
    finally:
        serving.close()
        topic_admin.delete_run(kafka_bootstrap, live_id)


def _group_partitions(group: str, topic: str):  # type: ignore[no-untyped-def]
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])


def test_describe_finds_a_runs_group_that_committed_nothing(kafka_bootstrap: str) -> None:
    run_id, run = _run(kafka_bootstrap, "nocommit")
    assert_describe_finds_idle_group(kafka_bootstrap, run_id, f"stacx-rollout-{run_id}", run.tasks)


def test_gc_run_deletes_the_runs_blobs_and_no_other(kafka_bootstrap: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    run_id, run = _run(kafka_bootstrap, "blobs")
    store = FsspecBlobStore(str(tmp_path))
    store.put(b"a batch too large for a record", prefix=run.batches)
    store.put(b"a trajectory too large for a record", prefix=run.trajectories)
    other, _ = store.put(b"another topic's blob", prefix="stacx.batches.someone-elses-run")
    code = _cli(["topics", "gc", "--run", run_id, "--store", str(tmp_path), "--bootstrap", kafka_bootstrap,
                 "--json"])
    report = json.loads(capsys.readouterr().out.splitlines()[0])
    assert code == 0 and report["blobs"] == 2, report
    assert store.list_blobs(run.batches) == [] and store.list_blobs(run.trajectories) == []
    assert [b.url for b in store.list_blobs("stacx.batches.someone-elses-run")] == [other]


def test_blobs_of_deleted_or_emptied_topics_are_orphans(kafka_bootstrap: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    run_id, run = _run(kafka_bootstrap, "emptied")
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(run.batches, key=b"b", value=b"a record retention removes")
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # what retention does to an old segment: the log start moves to the end
    for future in admin.delete_records([TopicPartition(run.batches, 0, -1)]).values():
        future.result(timeout=60)
    assert referenced_in_topic(kafka_bootstrap, run.batches, timeout_s=5) == set()
    store = FsspecBlobStore(str(tmp_path))
    store.put(b"a batch whose record retention removed", prefix=run.batches)
    gone = f"stacx.batches.{run_name('deleted')}"  # a topic deleted (by hand) with its blobs left
    store.put(b"a batch of a deleted topic", prefix=gone)
    old = time.time() - 7200
    for topic in (run.batches, gone):
        for blob in store.list_blobs(topic):
            os.utime(blob.url.removeprefix("file://"), (old, old))
    try:
        code = _cli(["topics", "gc", run.batches, gone, "--store", str(tmp_path),
                     "--bootstrap", kafka_bootstrap, "--grace", "1"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert store.list_blobs(run.batches) == [] and store.list_blobs(gone) == [], out
    finally:
        topic_admin.delete_run(kafka_bootstrap, run_id)


def _cli(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exit_info:
        return int(exit_info.code or 0)
    return 0
