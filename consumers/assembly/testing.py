"""Test support: an in-memory `Forwarder`, an in-memory `GapReader`, a read-counting table and
a builder of small valid trajectories."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Message
from faust.types import TP

from stacx.consumers.assembly.protocols import Output
from stacx.schemas.records import (
    Trajectory,
    TrajectoryStatus,
    logprobs,
    loss_mask,
    token_ids,
    trajectory_id,
)

__all__ = [
    "ListForwarder",
    "ReadCountingTable",
    "RecordsReader",
    "WriteCountingTable",
    "kafka_record",
    "make_trajectory",
    "on_topic",
]


class WriteCountingTable(dict[str, Any]):
    """A dict that counts writes and deletes (each is one changelog record in Faust)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def __setitem__(self, key: str, value: Any) -> None:
        self.writes += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.writes += 1
        super().__delitem__(key)


class ReadCountingTable(dict[str, Any]):
    """A dict that counts the records read from it (a lookup, or one per record iterated)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __getitem__(self, key: str) -> Any:
        self.reads += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)

    def __iter__(self) -> Iterator[str]:
        for key in super().__iter__():
            self.reads += 1
            yield key

    def items(self) -> Any:
        self.reads += len(self)
        return super().items()

    def keys(self) -> Any:
        self.reads += len(self)
        return super().keys()

    def values(self) -> Any:
        self.reads += len(self)
        return super().values()


class ListForwarder:
    """Collects agent outputs instead of publishing them."""

    def __init__(self) -> None:
        self.outputs: list[Output] = []

    async def send(self, output: Output) -> None:
        self.outputs.append(output)

    def on(self, topic: str) -> list[Output]:
        """The outputs sent to `topic`, in order."""
        return [o for o in self.outputs if o.topic == topic]


class RecordsReader:
    """A `GapReader` over records kept in memory: every partition starts at `start`."""

    def __init__(self, records: list[Any] | None = None, *, start: int = 0) -> None:
        self.records = records or []
        """confluent-kafka `Message`s (they can be built with keyword arguments)."""
        self.start = start
        self.reads: list[tuple[str, int, range]] = []

    def start_offset(self, topic: str, partition: int) -> int:
        return self.start

    def end_offset(self, topic: str, partition: int) -> int:
        offsets = [r.offset() for r in self.records if (r.topic(), r.partition()) == (topic, partition)]
        return max(offsets, default=self.start - 1) + 1

    def read(self, topic: str, partition: int, offsets: range) -> list[Any]:
        self.reads.append((topic, partition, offsets))
        where = (topic, partition)
        return [r for r in self.records if (r.topic(), r.partition()) == where and r.offset() in offsets]

    def records_since(self, topic: str, timestamp_ms: int) -> list[Any]:
        return [r for r in self.records if r.topic() == topic and r.timestamp()[1] >= timestamp_ms]

    def close(self) -> None:
        pass


def kafka_record(topic: str, offset: int, value: bytes, key: bytes = b"", partition: int = 0) -> Message:
    """A confluent-kafka record, as a `GapReader` returns them."""
    return Message(topic=topic, partition=partition, offset=offset, key=key, value=value, timestamp=(1, 1000))


@contextlib.contextmanager
def on_topic(agent: Any, topic: str) -> Iterator[None]:
    """Messages put into a Faust agent's `test_context` meanwhile arrive as if on `topic` (the
    test channel has no name)."""
    original = agent.to_message

    def to_message(*args: Any, **kwargs: Any) -> Any:
        message = original(*args, **kwargs)
        message.topic, message.tp = topic, TP(topic, message.partition)
        return message

    agent.to_message = to_message
    try:
        yield
    finally:
        del agent.to_message


def make_trajectory(
    group_id: str,
    sample_index: int,
    *,
    task_type: str = "math",
    policy_version: int = 0,
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED,
    reward: float | None = None,
    model_name: str = "policy",
    num_prompt: int = 3,
    num_completion: int = 2,
) -> Trajectory:
    """A small valid trajectory whose tokens encode its sample index (reward = index)."""
    task_id = f"task-{group_id}"
    base = 100 * sample_index
    prompt = [base + i for i in range(num_prompt)]
    completion = [base + 50 + i for i in range(num_completion)]
    return Trajectory(
        trajectory_id=trajectory_id(task_id, group_id, sample_index, policy_version),
        group_id=group_id,
        sample_index=sample_index,
        task_id=task_id,
        task_type=task_type,
        model_name=model_name,
        policy_version=policy_version,
        token_ids=token_ids(prompt + completion),
        loss_mask=loss_mask([0] * num_prompt + [1] * num_completion),
        logprobs=logprobs([0.0] * num_prompt + [-0.5] * num_completion),
        prompt_length=num_prompt,
        reward=float(sample_index) if reward is None else reward,
        status=status,
    )
