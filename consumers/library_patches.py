"""Every place STACX adapts Faust or aiokafka where they offer no setting, in one module.

Each adaptation names what it changes and why, and fails loudly (`LibraryMoved`) when the installed
library no longer has what it changes, instead of silently doing nothing;
`tests/unit/assembly/test_library_patches.py` checks each one against the installed versions.

- `IdempotentProducer`: Faust's aiokafka producer with idempotence on (acks=all, producer id and
  sequence numbers): Faust turns it on only in its exactly-once mode, which STACX does not use.
- `ShortFetchConsumer`: Faust's consumer whose Kafka consumer's fetches wait at most the app's
  `fetch_max_wait_ms` on quiet partitions; Faust fixes 1,500 ms, and aiokafka keeps one fetch in
  flight per broker, so a fetch held on quiet partitions keeps the busy ones waiting.
- `use_fast_lz4`: aiokafka compresses lz4 at level 9 (LZ4 HC, ~280 MB/s) where librdkafka and every
  other STACX producer use the fast level (~5 GB/s, 3 % more bytes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import version
from typing import Any, cast

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AiokafkaConsumer
from faust.transport.drivers.aiokafka import Producer as AiokafkaProducer
from faust.types import ConsumerT, ProducerT

__all__ = [
    "FETCH_MAX_WAIT_MS",
    "IdempotentApp",
    "IdempotentProducer",
    "LibraryMoved",
    "ShortFetchConsumer",
    "use_fast_lz4",
]

FETCH_MAX_WAIT_MS = 100
"""The assembler's and the on-call join's longest fetch wait on quiet partitions."""


class LibraryMoved(RuntimeError):
    """An installed library no longer has what a patch of this module changes."""

    def __init__(self, package: str, what: str) -> None:
        super().__init__(
            f"{package} {version(package)} has no {what}, which STACX adapts (consumers/library_patches.py): "
            "install the version pyproject.toml was tested with, or update the patch"
        )


class IdempotentProducer(AiokafkaProducer):
    """Faust's aiokafka producer with idempotence on: a retried send never writes a batch twice."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}


class ShortFetchConsumerThread(AIOKafkaConsumerThread):
    """Faust's consumer thread whose Kafka consumer waits at most the app's `fetch_max_wait_ms`."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        if not hasattr(consumer, "_fetch_max_wait_ms"):  # read by AIOKafkaConsumer.start
            raise LibraryMoved("aiokafka", "AIOKafkaConsumer._fetch_max_wait_ms")
        consumer._fetch_max_wait_ms = cast(IdempotentApp, self.app).fetch_max_wait_ms
        return consumer


class ShortFetchConsumer(AiokafkaConsumer):
    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)


class IdempotentApp(faust.App):
    """A Faust app with an `IdempotentProducer` and a `ShortFetchConsumer`, which runs `settle`
    (when set) before it stops consuming."""

    settle: Callable[[], Awaitable[None]] | None = None
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS

    def _new_producer(self) -> ProducerT:
        return IdempotentProducer(self.transport, loop=self.loop, beacon=self.beacon)

    def _new_consumer(self) -> ConsumerT:  # Faust's own, with ShortFetchConsumer
        return ShortFetchConsumer(
            self.transport,
            callback=self.topics.on_message,
            loop=self.loop,
            on_partitions_revoked=self._on_partitions_revoked,
            on_partitions_assigned=self._on_partitions_assigned,
            beacon=self.beacon,
        )

    async def on_stop(self) -> None:
        if self.settle is not None:
            await self.settle()
        await super().on_stop()


def use_fast_lz4() -> None:
    """Make aiokafka compress lz4 at the fast level in its record builders (C and Python).
    Idempotent."""
    from aiokafka.record import default_records, legacy_records

    modules: list[Any] = [default_records, legacy_records]
    try:
        from aiokafka.record._crecords import default_records as c_default
        from aiokafka.record._crecords import legacy_records as c_legacy

        modules += [c_default, c_legacy]
    except ImportError:  # pure-Python aiokafka
        pass
    patched = [module for module in modules if hasattr(module, "lz4_encode")]
    if not patched:
        raise LibraryMoved("aiokafka", "lz4_encode in its record builders")
    for module in patched:
        module.lz4_encode = _fast_lz4_encode


def _fast_lz4_encode(payload: Any) -> bytes:
    from aiokafka import codec

    return codec.lz4_encode(payload, level=0)
