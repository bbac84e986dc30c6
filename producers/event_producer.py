"""EventProducer: typed records -> Kafka, idempotent, compressed, batched, non-blocking."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from stacx.producers.blobs import DEFAULT_BLOB_ENV, FsspecBlobStore, default_blob_url, is_local_url
from stacx.producers.errors import DeliveryError, ProducerClosedError
from stacx.producers.kafka_log import kafka_logger
from stacx.producers.tracing import TRACEPARENT, publish_span, trace_headers
from stacx.schemas import topics
from stacx.schemas.catalogue import SchemaCatalogue
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.codec import Codec
from stacx.schemas.identity import record_id, record_key
from stacx.schemas.validation import validate as validate_record

__all__ = ["Delivery", "EventProducer", "registry_client"]

log = logging.getLogger(__name__)

Headers = Mapping[str, str | bytes] | None

_BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""Kafka's default max.message.bytes, for topics whose config cannot be read."""
_HEADROOM_BYTES = 4096
"""Room left under a topic's max.message.bytes for the batch framing, key and headers."""
_GUESS_TTL_S = 60.0
"""How long a limit guessed for a topic that does not exist yet is used before asking again."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where an acknowledged record landed."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    record_id: str


def _bootstrap_default() -> str:
    return topics.default_bootstrap()


@functools.cache
def registry_client(url: str) -> Any:
    """One SchemaRegistryClient per URL in this process (`mock://...` gives a shared in-memory one)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient.new_client({"url": url})


class EventProducer:
    """Publishes typed records (schemas/records.py) to Kafka.

    `publish()` returns at once with a Future resolved by the broker's acknowledgement; a full
    local queue blocks the caller (backpressure) instead of raising; a failed delivery sets the
    future's exception and is logged with the record id. Records larger than the topic allows go
    through the claim check. `close()` flushes.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        bootstrap_servers: str = field(default_factory=_bootstrap_default)
        """Kafka bootstrap.servers (default: $STACX_KAFKA or 127.0.0.1:9092)."""
        client_id: str = "stacx-producer"
        """client.id shown in broker logs and metrics."""
        compression: str = "lz4"
        """compression.type: none, gzip, snappy, lz4 or zstd."""
        linger_ms: float = 5.0
        """How long to wait to fill a batch (linger.ms)."""
        batch_size_bytes: int = 1_000_000
        """Largest batch per partition (batch.size)."""
        max_message_bytes: int = topics.DEFAULT_MAX_MESSAGE_BYTES
        """Largest record this producer sends inline (message.max.bytes); larger ones are claim-checked."""
        claim_check_threshold_bytes: int | None = None
        """Encoded size above which records go to the blob store; None: the topic's max.message.bytes."""
        blob_store_url: str = field(default_factory=default_blob_url)
        """fsspec root of the claim-check blob store (local dir by default, s3://... etc.)."""
        queue_max_messages: int = 100_000
        """Local queue bound in records (queue.buffering.max.messages); beyond it publish() waits."""
        queue_max_kbytes: int = 1_048_576
        """Local queue bound in KiB (queue.buffering.max.kbytes)."""
        delivery_timeout_ms: int = 120_000
        """Give up on a record after this long (delivery.timeout.ms); its future then fails."""
        schema_registry_url: str | None = None
        """Confluent schema registry URL; when set, events use the Confluent wire format."""
        register_schemas: bool = True
        """Register each schema in the catalogue topic before its first event."""
        schemas_topic: str = topics.SCHEMAS
        """Schema catalogue topic."""
        trace_context: bool = True
        """Inject the current W3C trace context into each event's headers."""
        validate: bool = True
        """Refuse records that break their type's invariants (`stacx.schemas.validation`: equal array
        lengths, finite rewards and logprobs...) with `RecordValidationError` naming the field."""
        poll_interval_s: float = 0.1
        """Poll period of the background thread that serves delivery reports."""
        kafka: dict[str, Any] = field(default_factory=dict)
        """Extra librdkafka options (override everything above)."""

        def __post_init__(self) -> None:
            if self.compression not in {"none", "gzip", "snappy", "lz4", "zstd"}:
                raise ValueError(
                    f"EventProducer.Config.compression={self.compression!r}: "
                    "use none, gzip, snappy, lz4 or zstd"
                )
            if self.max_message_bytes <= _HEADROOM_BYTES:
                raise ValueError(
                    f"EventProducer.Config.max_message_bytes={self.max_message_bytes} "
                    f"is too small: use more than {_HEADROOM_BYTES}"
                )

    def __init__(self, config: Config | None = None) -> None:
        from confluent_kafka import Producer

        self.config = config = config or EventProducer.Config()
        self._catalogue: SchemaCatalogue | None = None
        self.codec = self._build_codec(config)
        self._producer = Producer(self._librdkafka_config(config))
        self._blobs: FsspecBlobStore | None = None
        self._limits: dict[str, int] = {}
        self._guessed: dict[str, float] = {}
        """Topics whose limit is a guess (the topic did not exist): when to ask again."""
        self._clock = time.monotonic
        self._admin: Any = None
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="stacx-producer-poll", daemon=True)
        self._poller.start()

    # -- public API --------------------------------------------------------------------------

    def publish(
        self, topic: str, record: object, *, key: str | bytes | None = None, headers: Headers = None
    ) -> Future[Delivery]:
        """Encode and enqueue `record`; the future resolves once the broker acknowledged it.

        Raises `RecordValidationError` (nothing is sent) when `record` breaks an invariant of its
        type, e.g. a NaN reward: bad data is stopped where it is made."""
        if self._closed.is_set():
            raise ProducerClosedError("publish() on a closed EventProducer")
        if self.config.validate:
            validate_record(record)
        value = self.codec.encode(record)
        rid = record_id(record)
        limit = self._limits.get(topic)
        if limit is None or (topic in self._guessed and self._clock() >= self._guessed[topic]):
            limit = self._limit_for(topic)
        if len(value) > limit:
            value = self._claim_check(topic, record, rid, value)
        return self._send(topic, value, record_key(record) if key is None else key, headers, rid)

    def publish_async(
        self, topic: str, record: object, *, key: str | bytes | None = None, headers: Headers = None
    ) -> asyncio.Future[Delivery]:
        """`publish()` for asyncio code: await the result to wait for the acknowledgement."""
        return asyncio.wrap_future(self.publish(topic, record, key=key, headers=headers))

    def publish_bytes(
        self,
        topic: str,
        value: bytes,
        *,
        key: str | bytes | None = None,
        headers: Headers = None,
        record_id: str = "",
    ) -> Future[Delivery]:
        """Enqueue an already encoded value as is (no codec, no claim check)."""
        if self._closed.is_set():
            raise ProducerClosedError("publish_bytes() on a closed EventProducer")
        return self._send(topic, value, key, headers, record_id)

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait until every queued record is acknowledged or failed; returns how many remain."""
        return int(self._producer.flush(-1 if timeout_s is None else timeout_s))

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop the background poller. Records still queued after `timeout_s` fail."""
        if self._closed.is_set():
            return
        remaining = self.flush(timeout_s)
        if remaining:  # fail their futures (purge triggers their delivery reports) rather than hang
            log.error("EventProducer closing with %d records undelivered: failing them", remaining)
            self._producer.purge()
            self._producer.flush(5.0)
        self._closed.set()
        self._poller.join()
        close = getattr(self._producer, "close", None)  # confluent-kafka >= 2.11: free the client
        if close is not None:  # now, not at garbage collection (it would keep reconnecting)
            close()
        if self._catalogue is not None:
            self._catalogue.close()

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _send(
        self, topic: str, value: bytes, key: str | bytes | None, headers: Headers, rid: str
    ) -> Future[Delivery]:
        future: Future[Delivery] = Future()
        callback = functools.partial(_on_delivery, future, rid)
        with publish_span(topic, rid):
            kafka_headers = self._headers(headers, value)
        while True:
            try:
                if kafka_headers:
                    self._producer.produce(topic, value, key, headers=kafka_headers, on_delivery=callback)
                else:
                    self._producer.produce(topic, value, key, on_delivery=callback)
                return future
            except BufferError:  # local queue full: serve delivery reports to make room
                self._producer.poll(0.05)
            except Exception as exc:  # KafkaException: unknown topic, record too large...
                log.error("record %s to %s rejected: %s", rid or "(no id)", topic, exc)
                future.set_exception(DeliveryError(topic, rid, str(exc)))
                return future

    def _headers(self, headers: Headers, value: bytes = b"") -> list[tuple[str, str | bytes | None]] | None:
        """The caller's headers, plus the current trace context unless they carry one already
        (a dead letter or a re-published event keeps its original trace), plus the value's
        `content-type` and schema fingerprint unless the caller names them."""
        given = [(k, v.encode() if isinstance(v, str) else v) for k, v in (headers or {}).items()]
        out: list[tuple[str, str | bytes | None]] = []
        if self.config.trace_context and not any(k == TRACEPARENT for k, _ in given):
            out += trace_headers()
        names = {k for k, _ in given}
        out += [(k, v) for k, v in self.codec.content_headers(value) if k not in names]
        return (out + given) or None

    def _poll_loop(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(self.config.poll_interval_s)
        self._producer.poll(0)

    def _limit_for(self, topic: str) -> int:
        limit = self.config.claim_check_threshold_bytes
        if limit is None:
            limit = min(self._topic_max_bytes(topic), self.config.max_message_bytes) - _HEADROOM_BYTES
        self._limits[topic] = limit
        return limit

    def _topic_max_bytes(self, topic: str) -> int:
        """The topic's max.message.bytes; for a topic that does not exist yet, what the broker
        will give it when it is auto-created (its message.max.bytes), asked again later."""
        resource = self._config_resource("topic", topic)
        try:
            entries = self._admin_client().describe_configs([resource])[resource].result(timeout=10)
            self._guessed.pop(topic, None)
            return int(entries["max.message.bytes"].value)
        except Exception as exc:  # topic not created yet (auto-create) or broker slow
            limit = self._broker_max_bytes()
            log.info("max.message.bytes of %s unknown (%s); using the broker's %d for now", topic, exc, limit)
            self._guessed[topic] = self._clock() + _GUESS_TTL_S
            return limit

    def _broker_max_bytes(self) -> int:
        """The broker's message.max.bytes (the limit of topics it creates), else Kafka's default."""
        try:
            admin = self._admin_client()
            broker = next(iter(admin.list_topics(timeout=10).brokers))
            resource = self._config_resource("broker", str(broker))
            entries = admin.describe_configs([resource])[resource].result(timeout=10)
            return int(entries["message.max.bytes"].value)
        except Exception as exc:
            log.info("broker message.max.bytes unknown (%s); assuming Kafka's default", exc)
            return _BROKER_DEFAULT_MAX_MESSAGE_BYTES

    def _admin_client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(
                {"bootstrap.servers": self.config.bootstrap_servers, **_connection_options(self.config.kafka)}
            )
        return self._admin

    @staticmethod
    def _config_resource(kind: str, name: str) -> Any:
        from confluent_kafka.admin import ConfigResource

        return ConfigResource(kind, name)

    def _claim_check(self, topic: str, record: object, rid: str, value: bytes) -> bytes:
        if self._blobs is None:
            self._blobs = FsspecBlobStore(self.config.blob_store_url)
            self._warn_if_local(self._blobs.root_url)
        url, digest = self._blobs.put(value, prefix=topic)
        log.debug("record %s (%d bytes) to %s stored by claim check at %s", rid, len(value), topic, url)
        claim = ClaimCheck(
            uri=url,
            size_bytes=len(value),
            sha256=digest,
            record_type=self.codec.local_schema(type(record)).name,
            record_id=rid,
        )
        return self.codec.encode(claim)

    def _warn_if_local(self, url: str) -> None:
        hosts = [h.rsplit(":", 1)[0] for h in self.config.bootstrap_servers.split(",")]
        if is_local_url(url) and any(h not in ("127.0.0.1", "localhost", "::1", "[::1]") for h in hosts):
            log.warning(
                "claim-check blobs go to %s, a folder only this machine can read, while Kafka is at %s: "
                "set %s (e.g. s3://bucket/stacx-blobs) on every machine",
                url,
                self.config.bootstrap_servers,
                DEFAULT_BLOB_ENV,
            )

    def _build_codec(self, config: Config) -> Codec:
        if config.schema_registry_url:
            return Codec(registry=registry_client(config.schema_registry_url))
        if not config.register_schemas:
            return Codec()
        self._catalogue = SchemaCatalogue(
            SchemaCatalogue.Config(bootstrap_servers=config.bootstrap_servers, topic=config.schemas_topic)
        )
        return Codec(on_new_schema=self._catalogue.register)

    @staticmethod
    def _librdkafka_config(config: Config) -> dict[str, Any]:
        return {
            "bootstrap.servers": config.bootstrap_servers,
            "client.id": config.client_id,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": config.compression,
            "linger.ms": config.linger_ms,
            "batch.size": config.batch_size_bytes,
            "message.max.bytes": config.max_message_bytes,
            "queue.buffering.max.messages": config.queue_max_messages,
            "queue.buffering.max.kbytes": config.queue_max_kbytes,
            "delivery.timeout.ms": config.delivery_timeout_ms,
            "logger": kafka_logger(),
            **config.kafka,
        }


def _connection_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The security options of a client config, which every client of a cluster needs."""
    return {k: v for k, v in options.items() if k.startswith(("security.", "sasl.", "ssl."))}


def _on_delivery(future: Future[Delivery], rid: str, err: Any, msg: Any) -> None:
    try:
        if err is not None:
            log.error("record %s to %s not delivered: %s", rid or "(no id)", msg.topic(), err)
            future.set_exception(DeliveryError(msg.topic(), rid, str(err), retriable=bool(err.retriable())))
            return
        future.set_result(Delivery(msg.topic(), msg.partition(), msg.offset(), msg.timestamp()[1], rid))
    except InvalidStateError:  # cancelled by its waiter (a command stopping): nobody reads it
        pass
