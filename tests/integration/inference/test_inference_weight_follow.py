"""Real Kafka: the weight subscriber keeps a live built-in server on the newest version."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from inference_fixtures import serve_tiny
from ports import free_port

from stacx.consumers.weights import WeightSubscriber, subscriber_group
from stacx.producers import EventProducer
from stacx.rollout.inference import InferenceServer
from stacx.schemas.records import WeightVersion
from stacx.schemas.topics import TOPICS, WEIGHTS

WEIGHTS_CONFIG = next(spec.config for spec in TOPICS if spec.name == WEIGHTS)
STACX = str(Path(sys.executable).with_name("stacx"))


@pytest.fixture
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serve_tiny(tiny_model_dir) as srv:
        yield srv


def _generate(base_url: str) -> tuple[list[int], str]:
    body = {
        "input_ids": [60, 61, 62],
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
    }
    answer = httpx.post(f"{base_url}/generate", json=body, timeout=60).json()
    return answer["output_ids"], answer["meta_info"]["weight_version"]


def _wait_for_version(base_url: str, version: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{base_url}/get_model_info").json()["weight_version"] == version:
            return
        time.sleep(0.1)
    pytest.fail(f"server never reported weight_version {version}")


def test_subscriber_applies_latest_then_follows_newer_versions(
    kafka_bootstrap: str,
    fresh_topic: Callable[..., str],
    fresh_group: str,
    server: InferenceServer,
    tiny_model_dir: Path,
    other_model_dir: Path,
) -> None:
    topic = fresh_topic("weights", partitions=1, config=WEIGHTS_CONFIG)
    producer = EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap))

    def publish(model: str, version: int, path: Path) -> None:
        record = WeightVersion(model_name=model, version=version, path=str(path))
        producer.publish(topic, record, key=model).result(timeout=30)

    baseline, _ = _generate(server.base_url)
    publish("policy", 1, tiny_model_dir)
    publish("policy", 2, other_model_dir)
    publish("critic", 9, tiny_model_dir)
    subscriber = WeightSubscriber(
        WeightSubscriber.Config(
            model_name="policy",
            server_url=server.base_url,
            bootstrap_servers=kafka_bootstrap,
            topic=topic,
            group_id=fresh_group,
        )
    )
    stop = threading.Event()
    follower = threading.Thread(target=subscriber.run, args=(stop,))
    follower.start()
    try:
        _wait_for_version(server.base_url, "2")
        swapped, version = _generate(server.base_url)
        assert version == "2" and swapped != baseline
        publish("policy", 1, tiny_model_dir)  # older: ignored
        publish("policy", 3, tiny_model_dir)  # newer: applied
        _wait_for_version(server.base_url, "3")
        restored, version = _generate(server.base_url)
        assert version == "3" and restored == baseline
        assert subscriber.applied is not None and subscriber.applied.version == 3
    finally:
        stop.set()
        follower.join(timeout=30)
        subscriber.close()
        producer.close()
    assert subscriber.num_ignored >= 1


def _delete_groups_of(bootstrap: str, model: str) -> None:
    """The subscriber's consumer group (named after the model) goes with the test."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups(request_timeout=10).result()
    ours = [g.group_id for g in listed.valid if model in g.group_id]
    for future in admin.delete_consumer_groups(ours, request_timeout=10).values() if ours else []:
        with contextlib.suppress(Exception):  # housekeeping: already gone is fine
            future.result()


def test_a_restarted_server_is_ready_only_once_it_serves_the_newest_version(
    kafka_bootstrap: str,
    fresh_topic: Callable[..., str],
    tiny_model_dir: Path,
    other_model_dir: Path,
    tmp_path: Path,
) -> None:
    """`stacx serve --follow-weights` after a restart: every moment /health says ready, the
    server already answers with the newest published version, never its base weights."""
    topic = fresh_topic("weights", partitions=1, config=WEIGHTS_CONFIG)
    model = f"policy-{uuid.uuid4().hex[:8]}"
    with EventProducer(EventProducer.Config(bootstrap_servers=kafka_bootstrap)) as producer:
        record = WeightVersion(model_name=model, version=5, path=str(other_model_dir))
        producer.publish(topic, record, key=model).result(timeout=30)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [STACX, "serve", "--model", str(tiny_model_dir), "--port", str(port), "--threads", "1",
         "--follow-weights", model, "--weights-topic", topic, "--bootstrap-servers", kafka_bootstrap],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    answers: list[tuple[int, str]] = []  # (/health status, weight_version) from start-up on
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and serve.poll() is None and (200, "5") not in answers:
            try:
                health = httpx.get(f"{base_url}/health", timeout=5)
                version = httpx.get(f"{base_url}/model_info", timeout=5).json()["weight_version"]
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            answers.append((health.status_code, version))
            if health.status_code != 200:
                assert health.json()["status"] == "starting"
        assert (200, "5") in answers, (answers[-5:], (tmp_path / "serve.log").read_text()[-2000:])
        assert all(version == "5" for status, version in answers if status == 200), answers
        _, version = _generate(base_url)
        assert version == "5"
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)
        log.close()
        members = _members_of(kafka_bootstrap, model)
        _delete_groups_of(kafka_bootstrap, model)
    # the stopped server left its follower group at once (else it stays "running" for a session
    # timeout, and `stacx topics gc --run` refuses to delete the run)
    assert members == {subscriber_group(model, base_url, topic): 0}, members


def _members_of(bootstrap: str, model: str) -> dict[str, int]:
    """Members of every consumer group named after the model, by group."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups(request_timeout=10).result()
    ours = [g.group_id for g in listed.valid if model in g.group_id]
    described = admin.describe_consumer_groups(ours, request_timeout=10) if ours else {}
    return {group: len(future.result().members) for group, future in described.items()}
