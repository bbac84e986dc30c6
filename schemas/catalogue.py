"""The schema catalogue: every writer schema version, kept in the compacted `stacx.schemas` topic.

Writers `register` a schema before its first event (key = fingerprint, value = schema JSON);
readers `lookup` fingerprints they do not know, which re-reads the topic to its end.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from stacx.schemas import topics
from stacx.schemas.codec import Codec, SchemaInfo, builtin_schemas, load_schema
from stacx.schemas.errors import SchemaError

__all__ = ["SchemaCatalogue", "catalogue_codec"]

log = logging.getLogger(__name__)


class SchemaCatalogue:
    """Registers and resolves Avro schemas through a compacted Kafka topic."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        bootstrap_servers: str = topics.DEFAULT_BOOTSTRAP
        """Kafka bootstrap.servers."""
        topic: str = topics.SCHEMAS
        """Compacted catalogue topic (key: fingerprint hex, value: schema JSON)."""
        timeout_s: float = 15.0
        """Deadline for one registration or one catalogue read."""
        min_refresh_interval_s: float = 2.0
        """Lookups of unknown fingerprints re-read the topic at most this often."""
        create_topic: bool = True
        """Create the catalogue topic (with its `stacx.schemas.topics` spec) when it is missing."""
        topic_policy: topics.TopicPolicy = field(default_factory=topics.TopicPolicy)
        """Replication (and compression) the catalogue topic is created with."""
        kafka: dict[str, str] = field(default_factory=dict)
        """Extra librdkafka options for the catalogue's clients."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._known: dict[str, SchemaInfo] = {i.fingerprint: i for i in builtin_schemas()}
        self._registered: set[str] = set()
        self._in_topic: dict[str, SchemaInfo] = {}
        self._producer: Any = None
        self._last_refresh = 0.0
        self._lock = threading.RLock()

    def register(self, info: SchemaInfo) -> None:
        """Store `info` in the catalogue (idempotent; blocks until the broker acknowledged it)."""
        with self._lock:
            if info.fingerprint in self._registered:
                return
            self._produce(info)
            self._registered.add(info.fingerprint)
            self._known[info.fingerprint] = info
            log.debug("registered schema %s %s in %s", info.name, info.fingerprint, self.config.topic)

    def lookup(self, fingerprint: str) -> SchemaInfo | None:
        """The schema with this fingerprint, re-reading the catalogue if it is not known yet."""
        with self._lock:
            if fingerprint not in self._known:
                if time.monotonic() - self._last_refresh >= self.config.min_refresh_interval_s:
                    self.refresh()
            return self._known.get(fingerprint)

    def versions(self, name: str) -> list[SchemaInfo]:
        """Every known version of the record `name` (Avro full name)."""
        return [i for i in self._known.values() if i.name == name]

    def registered(self, name: str | None = None) -> list[SchemaInfo]:
        """Versions read from the catalogue topic by the last `refresh()` (of `name`, if given)."""
        return [i for i in self._in_topic.values() if name is None or i.name == name]

    def all(self) -> list[SchemaInfo]:
        """Every known schema version."""
        return list(self._known.values())

    def refresh(self) -> None:
        """Read the whole catalogue topic (from the beginning to its current end)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self._last_refresh = time.monotonic()
        consumer = Consumer(
            self._client_config(
                **{
                    "group.id": f"stacx-catalogue-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "enable.partition.eof": True,
                }
            )
        )
        try:
            partitions = self._partitions(consumer)
            if not partitions:
                return
            ends = {
                p: consumer.get_watermark_offsets(
                    TopicPartition(self.config.topic, p), timeout=self.config.timeout_s
                )[1]
                for p in partitions
            }
            pending = {p for p, end in ends.items() if end > 0}
            consumer.assign([TopicPartition(self.config.topic, p, OFFSET_BEGINNING) for p in pending])
            self._read_until(consumer, ends, pending)
        finally:
            consumer.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.config.timeout_s)
            self._producer = None

    # -- internals ---------------------------------------------------------------------------

    def _read_until(self, consumer: Any, ends: dict[int, int], pending: set[int]) -> None:
        deadline = time.monotonic() + self.config.timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    pending.discard(msg.partition())
                continue
            self._ingest(msg.key(), msg.value())
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
        if pending:
            raise SchemaError(f"timed out reading schema catalogue {self.config.topic!r}")

    def _ingest(self, key: bytes | None, value: bytes | None) -> None:
        if not value:  # tombstone: the version was withdrawn (readers that know it keep it)
            self._in_topic.pop(key.decode("ascii", "replace") if key else "", None)
            return
        try:
            info = load_schema(value.decode("utf-8"))
        except (SchemaError, UnicodeDecodeError, ValueError) as exc:
            log.warning("skipping unreadable schema %r in catalogue: %s", key, exc)
            return
        self._known[info.fingerprint] = info
        self._in_topic[info.fingerprint] = info

    def _partitions(self, consumer: Any) -> list[int]:
        meta = consumer.list_topics(self.config.topic, timeout=self.config.timeout_s)
        topic = meta.topics.get(self.config.topic)
        if topic is None or topic.error is not None:
            return []
        return sorted(topic.partitions)

    def _produce(self, info: SchemaInfo) -> None:
        from confluent_kafka import Producer

        if self._producer is None:
            self._ensure_topic()
            self._producer = Producer(self._client_config(**{"acks": "all", "enable.idempotence": True}))
        errors: list[Any] = []
        self._producer.produce(
            self.config.topic,
            key=info.fingerprint,
            value=info.text.encode(),
            headers=[("stacx-schema-name", info.name.encode())],
            on_delivery=lambda err, _msg: errors.append(err),
        )
        self._producer.flush(self.config.timeout_s)
        if not errors or errors[0] is not None:
            raise SchemaError(
                f"could not register schema {info.name} ({info.fingerprint}) in "
                f"{self.config.topic!r}: {errors[0] if errors else 'no delivery report in time'}; "
                "is the broker up (`stacx infra status`)?"
            )

    def _ensure_topic(self) -> None:
        if not self.config.create_topic:
            return
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self._client_config())
        if self.config.topic in admin.list_topics(timeout=self.config.timeout_s).topics:
            return
        spec = self.config.topic_policy.apply(topics.spec_for("schemas", self.config.topic), kind="schemas")
        new = NewTopic(
            spec.name,
            num_partitions=1,
            replication_factor=spec.replication_factor,
            config=dict(spec.config),
        )
        try:
            admin.create_topics([new])[self.config.topic].result(timeout=self.config.timeout_s)
        except Exception as exc:  # TOPIC_ALREADY_EXISTS from a concurrent writer is fine
            if "already exists" not in str(exc).lower():
                raise SchemaError(
                    f"cannot create schema catalogue topic {self.config.topic!r}: {exc}"
                ) from exc

    def _client_config(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.config.bootstrap_servers, **extra, **self.config.kafka}


def catalogue_codec(config: SchemaCatalogue.Config) -> Codec:
    """A Codec that registers its schemas in the catalogue and resolves unknown ones from it.

    For code that handles raw bytes itself (e.g. Faust agents) instead of EventProducer/EventConsumer.
    """
    catalogue = SchemaCatalogue(config)
    return Codec(resolver=catalogue.lookup, on_new_schema=catalogue.register)
