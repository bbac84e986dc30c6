"""Real Kafka: the weight subscriber keeps a live built-in server on the newest version."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from inference_fixtures import serve_tiny

from consumers.weights import WeightSubscriber
from producers import EventProducer
from rollout.inference import InferenceServer
from schemas.records import WeightVersion
from schemas.topics import TOPICS, WEIGHTS

WEIGHTS_CONFIG = next(spec.config for spec in TOPICS if spec.name == WEIGHTS)


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
