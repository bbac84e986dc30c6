"""Kafka topic names and their default configurations (ARCHITECTURE.md, "Topics")."""

from __future__ import annotations

from dataclasses import dataclass, field

TRAJECTORIES = "stacx.trajectories"
BATCHES = "stacx.batches"
WEIGHTS = "stacx.weights"
AGENT_LOGS = "stacx.agent-logs"
FEEDBACK = "stacx.feedback"
TASKS = "stacx.tasks"
DLQ = "stacx.dlq"
SCHEMAS = "stacx.schemas"
ONCALL_TRAJECTORIES = "stacx.oncall.trajectories"
"""Rewarded trajectories of the on-call join (created by the join worker, 1 partition)."""

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "STACX_KAFKA"

# Records above this size go through the claim check (see ARCHITECTURE.md, "Topics").
BATCHES_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic with the configuration `stacx infra up` creates it with."""

    name: str
    """Topic name."""
    partitions: int = 4
    """Partition count: the unit of consumer parallelism."""
    config: dict[str, str] = field(default_factory=dict)
    """Broker-side topic configs (`cleanup.policy`, `max.message.bytes`, ...)."""


def _compacted() -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "0.1",
        "segment.ms": "600000",
        "max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES),
    }


def _retained(max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> dict[str, str]:
    return {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "max.message.bytes": str(max_bytes),
        "compression.type": "producer",
    }


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(TRAJECTORIES, partitions=8, config=_retained()),
    TopicSpec(BATCHES, partitions=1, config=_retained(BATCHES_MAX_MESSAGE_BYTES)),
    TopicSpec(WEIGHTS, partitions=1, config=_compacted()),
    TopicSpec(AGENT_LOGS, partitions=4, config=_retained()),
    TopicSpec(FEEDBACK, partitions=4, config=_retained()),
    TopicSpec(TASKS, partitions=8, config=_retained()),
    TopicSpec(DLQ, partitions=1, config=_retained()),
    TopicSpec(SCHEMAS, partitions=1, config=_compacted()),
)
