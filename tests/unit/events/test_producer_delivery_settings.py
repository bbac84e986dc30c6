"""Every producer of trajectories and batches is idempotent and waits for all in-sync replicas:
the settings each one hands its Kafka client (a recording stand-in for the client)."""

from __future__ import annotations

import uuid
from typing import Any

import aiokafka
import confluent_kafka
import pytest

from stacx.consumers.assembly import AssemblerApp, GroupAssembler, MixturePlanner
from stacx.consumers.assembly.testing import ListForwarder, RecordsReader
from stacx.consumers.oncall import FeedbackJoin, OncallJoinApp
from stacx.producers import EventProducer
from stacx.schemas.codec import Codec


class _RecordingProducer:
    """Stands in for confluent_kafka.Producer: keeps the config it was built with."""

    configs: list[dict[str, Any]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        type(self).configs.append(dict(config))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        return 0

    def purge(self) -> None:
        pass


class _RecordingAioProducer:
    """Stands in for aiokafka.AIOKafkaProducer: keeps its settings, starts and stops at once."""

    settings: list[dict[str, Any]] = []

    def __init__(self, **settings: Any) -> None:
        type(self).settings.append(settings)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def flush(self) -> None:
        pass


def test_event_producer_asks_librdkafka_for_idempotent_acks_all_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_RecordingProducer, "configs", [])
    monkeypatch.setattr(confluent_kafka, "Producer", _RecordingProducer)
    producer = EventProducer(
        EventProducer.Config(bootstrap_servers="127.0.0.1:1", register_schemas=False, client_id="c")
    )
    producer.close()
    (config,) = _RecordingProducer.configs
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"
    assert config["bootstrap.servers"] == "127.0.0.1:1" and config["client.id"] == "c"
    assert config["compression.type"] == "lz4"


def _assembler_app() -> Any:
    config = AssemblerApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=2,
        grouping=GroupAssembler.Config(group_size=2),
        mixture=MixturePlanner.Config(batch_size=2),
    )
    return AssemblerApp(config, forwarder=ListForwarder(), codec=Codec(), gap_reader=RecordsReader()).app


def _oncall_app() -> Any:
    config = OncallJoinApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}", partitions=2, join=FeedbackJoin.Config(window_s=60.0)
    )
    return OncallJoinApp(config, forwarder=ListForwarder(), gap_reader=RecordsReader()).app


@pytest.mark.parametrize("build", [_assembler_app, _oncall_app], ids=["batches", "oncall-trajectories"])
async def test_faust_apps_producers_are_idempotent_with_acks_all(
    build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_RecordingAioProducer, "settings", [])
    monkeypatch.setattr(aiokafka, "AIOKafkaProducer", _RecordingAioProducer)
    app = build()
    await app.producer.start()
    await app.producer.stop()
    (settings,) = _RecordingAioProducer.settings
    assert settings["enable_idempotence"] is True
    assert settings["acks"] in ("all", -1)
