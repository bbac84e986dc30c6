"""STACX producers: typed records to Kafka (idempotent, compressed, batched, traced)."""

from stacx.producers.blobs import FsspecBlobStore, default_blob_url
from stacx.producers.errors import BlobStoreError, DeliveryError, ProducerClosedError, ProducerError
from stacx.producers.event_producer import Delivery, EventProducer
from stacx.producers.memory import InMemoryPublisher, StoredEvent
from stacx.producers.protocols import BlobStore, Publisher
from stacx.producers.tracing import context_from_headers, trace_headers

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
