"""A broker restart is weather, not a defect: transient Kafka errors (a partition changing
leader, a broker not answering yet) are retried; the assembler never dies of them, and the
events it was reading when one struck are neither lost nor skipped."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from stacx.consumers.assembly import AssemblerApp, GroupAssembler, MixturePlanner
from stacx.consumers.assembly.errors import AssemblyError, BrokerUnavailableError
from stacx.consumers.assembly.gaps import KafkaGapReader
from stacx.consumers.assembly.testing import (
    ListForwarder,
    RecordsReader,
    kafka_record,
    make_trajectory,
    on_topic,
)
from stacx.schemas.codec import Codec, encode


class RaisingConsumer:
    """Answers every watermark and committed-offset request with one Kafka error."""

    def __init__(self, code: int) -> None:
        self.code = code

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        raise KafkaException(KafkaError(self.code))

    def committed(self, *args: Any, **kwargs: Any) -> list[Any]:
        raise KafkaException(KafkaError(self.code))

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("code", "retriable"),
    [
        (KafkaError.NOT_LEADER_FOR_PARTITION, True),
        (KafkaError.LEADER_NOT_AVAILABLE, True),
        (KafkaError._TRANSPORT, True),
        (KafkaError._DESTROY_BROKER, True),  # a broker SIGKILLed or cut off: its connection torn down
        (KafkaError._RESOLVE, True),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, False),
    ],
)
def test_kafka_errors_of_a_settling_cluster_are_retriable(code: int, retriable: bool) -> None:
    reader = KafkaGapReader("127.0.0.1:1", f"unit-{uuid.uuid4().hex[:8]}", timeout_s=1)
    reader.close()
    reader._group = RaisingConsumer(code)  # type: ignore[assignment]
    with pytest.raises(AssemblyError) as end:
        reader.end_offset("stacx.trajectories", 0)
    with pytest.raises(AssemblyError) as start:
        reader.start_offset("stacx.trajectories", 0)
    assert end.value.retriable is start.value.retriable is retriable
    assert isinstance(end.value, BrokerUnavailableError) is retriable


class FlakyReader(RecordsReader):
    """Its first `failures` reads fail as a broker that just restarted answers."""

    def __init__(self, records: list[Any], failures: int) -> None:
        super().__init__(records)
        self.failures = failures

    def read(self, topic: str, partition: int, offsets: range) -> list[Any]:
        if self.failures:
            self.failures -= 1
            self.reads.append((topic, partition, offsets))
            raise BrokerUnavailableError(f"cannot read {topic}[{partition}]: NOT_LEADER_FOR_PARTITION")
        return super().read(topic, partition, offsets)


def test_a_fatal_error_is_never_transient() -> None:
    from stacx.consumers.assembly.gaps import is_transient

    assert is_transient(KafkaError(KafkaError._DESTROY_BROKER))
    assert not is_transient(KafkaError(KafkaError._DESTROY_BROKER, fatal=True))


async def test_a_transient_error_while_reading_a_gap_is_retried_and_nothing_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost, delivered = make_trajectory("g", 0), make_trajectory("g", 1)
    topic = "stacx.trajectories"
    reader = FlakyReader([kafka_record(topic, 0, encode(lost), b"g")], failures=2)
    out = ListForwarder()
    config = AssemblerApp.Config(
        app_id=f"unit-{uuid.uuid4().hex[:8]}",
        partitions=1,
        grouping=GroupAssembler.Config(group_size=2),
        mixture=MixturePlanner.Config(batch_size=2),
    )
    asm = AssemblerApp(config, forwarder=out, codec=Codec(), gap_reader=reader)
    crashes: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashes.append(exc)

    monkeypatch.setattr(asm.app, "crash", crash)
    async with asm.group_agent.test_context() as agent:
        with on_topic(agent, topic):
            agent.sent_offset = 1  # offset 0 never reaches the agent: it is read from Kafka
            await agent.put(encode(delivered), key=b"g", partition=0)
    assert crashes == []
    assert reader.reads == [(topic, 0, range(0, 1))] * 3  # two failures, then the read
    (group,) = out.on(asm.config.groups_topic)  # g closed with the sample read after the retry
    assert asm.stats.trajectories == 2
