"""Announcing exported weights: a WeightVersion event on `stacx.weights` (or a list, in tests)."""

from __future__ import annotations

from typing import Any

from stacx.schemas.records import WeightVersion
from stacx.trainer.config import ExportConfig

__all__ = ["InMemoryWeightPublisher", "KafkaWeightPublisher", "build_publisher"]


class InMemoryWeightPublisher:
    """Keeps published versions in `published` (tests and notebooks)."""

    def __init__(self) -> None:
        self.published: list[WeightVersion] = []

    def publish(self, version: WeightVersion) -> None:
        self.published.append(version)

    def close(self) -> None:
        pass


class KafkaWeightPublisher:
    """Publishes through the shared EventProducer; waits for the delivery report."""

    def __init__(self, config: ExportConfig, client_id: str = "stacx-trainer") -> None:
        from stacx.producers import EventProducer

        self.topic = config.topic
        self.producer: Any = EventProducer(
            EventProducer.Config(bootstrap_servers=config.bootstrap_servers, client_id=client_id))

    def publish(self, version: WeightVersion) -> None:
        """Publish and wait for the acknowledgement as long as the producer retries (its
        delivery timeout), so a broker restarting meanwhile costs a wait, not the trainer."""
        wait_s = self.producer.config.delivery_timeout_ms / 1000 + 5
        self.producer.publish(self.topic, version, key=version.model_name).result(timeout=wait_s)

    def close(self) -> None:
        self.producer.close()


def build_publisher(config: ExportConfig, client_id: str) -> KafkaWeightPublisher | None:
    """The Kafka publisher when exports are announced, else None."""
    if config.dir is None or not config.publish:
        return None
    return KafkaWeightPublisher(config, client_id)
