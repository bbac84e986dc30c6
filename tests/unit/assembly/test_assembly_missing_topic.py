"""A topic deleted under a running assembler: said once, outputs wait, nothing crashes."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest

from stacx.consumers.assembly import AssemblerApp, GroupAssembler, MixturePlanner, Output
from stacx.consumers.assembly.errors import OutputTopicMissing
from stacx.consumers.assembly.testing import ListForwarder, RecordsReader, make_trajectory
from stacx.schemas.codec import Codec, decode, encode
from stacx.schemas.records import TrainingBatch


def _assembler(forwarder: Any) -> AssemblerApp:
    config = AssemblerApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=1,
        grouping=GroupAssembler.Config(group_size=2),
        mixture=MixturePlanner.Config(batch_size=1),
    )
    return AssemblerApp(config, forwarder=forwarder, codec=Codec(), gap_reader=RecordsReader())


def test_aiokafka_metadata_errors_of_a_missing_topic_pass_once_per_topic(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka logs this at every metadata answer (every 100 ms per send waiting on it)."""
    _assembler(ListForwarder())
    cluster = logging.getLogger("aiokafka.cluster")  # as aiokafka.cluster.ClusterMetadata logs it
    with caplog.at_level(logging.ERROR, logger="aiokafka.cluster"):
        for _ in range(1000):
            for topic in ("run.batches", "run.dlq"):
                cluster.error("Topic %s not found in cluster metadata", topic)
        cluster.error("'%s' is not a valid topic name", "bad name")  # other lines pass as they are
    lines = [r.getMessage() for r in caplog.records if r.name == "aiokafka.cluster"]
    assert lines == [
        "Topic run.batches not found in cluster metadata",
        "Topic run.dlq not found in cluster metadata",
        "'bad name' is not a valid topic name",
    ]


class DeletedTopicForwarder(ListForwarder):
    """The batches topic is gone for the first `missing` sends to it."""

    def __init__(self, topic: str, missing: int) -> None:
        super().__init__()
        self.topic, self.missing = topic, missing

    async def send(self, output: Output) -> None:
        if output.topic == self.topic and self.missing:
            self.missing -= 1
            raise OutputTopicMissing(output.topic)
        await super().send(output)


async def test_a_deleted_batches_topic_is_said_once_and_the_batch_waits_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grouped = ListForwarder()
    asm = _assembler(grouped)
    async with asm.group_agent.test_context() as agent:
        for index in range(2):
            await agent.put(encode(make_trajectory("g", index)), key=b"g", partition=0)
    (group,) = grouped.on(asm.config.groups_topic)
    out = DeletedTopicForwarder(asm.config.batches_topic, missing=2)
    asm.forwarder = out
    async with asm.batch_agent.test_context() as agent:
        await asyncio.wait_for(agent.put(group.value, key=group.key), timeout=15)
    (batch,) = out.on(asm.config.batches_topic)
    assert set(decode(batch.value, TrainingBatch).group_ids) == {"g"}
    said = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
    assert said == [
        f"topic {asm.config.batches_topic!r} does not exist (deleted?); outputs to it wait "
        "(retrying with backoff) until it is created again (`stacx infra up` creates the "
        "standard topics)"
    ]
    assert out.missing == 0
