"""STACX producers: typed records to Kafka (idempotent, compressed, batched, traced)."""

from producers.blobs import FsspecBlobStore, default_blob_url
from producers.errors import BlobStoreError, DeliveryError, ProducerClosedError, ProducerError
from producers.event_producer import Delivery, EventProducer
from producers.memory import InMemoryPublisher, StoredEvent
from producers.protocols import BlobStore, Publisher
from producers.tracing import context_from_headers, trace_headers

__all__ = [
    "BlobStore",
    "BlobStoreError",
    "Delivery",
    "DeliveryError",
    "EventProducer",
    "FsspecBlobStore",
    "InMemoryPublisher",
    "ProducerClosedError",
    "ProducerError",
    "Publisher",
    "StoredEvent",
    "context_from_headers",
    "default_blob_url",
    "trace_headers",
]
