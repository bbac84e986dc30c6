"""STACX consumers: typed Kafka consumption, dead letters, replay, deduplication."""

from consumers.dedup import Deduplicator
from consumers.errors import CommitRefusedError, ConsumerClosedError, ConsumerError, UnexpectedRecordError
from consumers.event_consumer import ConsumedEvent, EventConsumer, Validator
from consumers.memory import InMemoryConsumer
from consumers.protocols import EventSource

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
