"""Each adaptation of `consumers/library_patches.py` takes effect on the installed Faust and
aiokafka, and one that finds nothing to change says so (never a silent no-op)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from aiokafka import codec
from aiokafka.record import default_records

from stacx.consumers import library_patches
from stacx.consumers.library_patches import IdempotentApp, LibraryMoved, use_fast_lz4


def _text(seed: int = 0) -> bytes:
    """Text with repeats in it, which LZ4 HC (level 9) and fast LZ4 compress differently."""
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    return b" ".join(rng.choice(words) for _ in range(20_000))


PAYLOAD = _text()


def test_aiokafka_writes_lz4_at_the_fast_level() -> None:
    use_fast_lz4()
    written = default_records.lz4_encode(PAYLOAD)  # type: ignore[attr-defined]
    assert written == codec.lz4_encode(PAYLOAD, level=0)
    assert written != codec.lz4_encode(PAYLOAD)  # aiokafka's own default, LZ4 HC
    assert codec.lz4_decode(written) == PAYLOAD


def test_a_patch_with_nothing_to_change_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.record import legacy_records

    modules: list[Any] = [default_records, legacy_records]
    try:
        from aiokafka.record._crecords import default_records as c_default
        from aiokafka.record._crecords import legacy_records as c_legacy

        modules += [c_default, c_legacy]
    except ImportError:
        pass
    for module in modules:
        if hasattr(module, "lz4_encode"):
            monkeypatch.delattr(module, "lz4_encode")
    with pytest.raises(LibraryMoved, match=r"^aiokafka \S+ has no lz4_encode .*library_patches\.py"):
        use_fast_lz4()


async def test_the_producer_is_idempotent_with_acks_all() -> None:
    app = IdempotentApp("stacx-test-patches", broker="kafka://127.0.0.1:9", store="memory://")
    settings = app.producer._settings_extra()  # type: ignore[attr-defined]
    assert settings["acks"] == "all" and settings["enable_idempotence"] is True


async def test_the_worker_consumer_waits_the_apps_fetch_time() -> None:
    app = IdempotentApp("stacx-test-patches-fetch", broker="kafka://127.0.0.1:9", store="memory://")
    app.fetch_max_wait_ms = 250
    consumer = app.consumer._thread._create_worker_consumer(app.transport)  # type: ignore[attr-defined]
    try:
        assert consumer._fetch_max_wait_ms == 250  # Faust's own is 1,500 ms
    finally:
        await consumer.stop()
    assert library_patches.FETCH_MAX_WAIT_MS == 100
