"""STACX consumers: typed Kafka consumption, dead letters, replay, deduplication."""

from stacx.consumers.dedup import Deduplicator
from stacx.consumers.errors import (
    CommitRefusedError,
    ConsumerClosedError,
    ConsumerError,
    UnexpectedRecordError,
)
from stacx.consumers.event_consumer import ConsumedEvent, EventConsumer, Validator
from stacx.consumers.memory import InMemoryConsumer
from stacx.consumers.protocols import EventSource

__all__ = [
    "CommitRefusedError",
    "ConsumedEvent",
    "ConsumerClosedError",
    "ConsumerError",
    "Deduplicator",
    "EventConsumer",
    "EventSource",
    "InMemoryConsumer",
    "UnexpectedRecordError",
    "Validator",
]
