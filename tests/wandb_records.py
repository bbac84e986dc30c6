"""Reading an offline W&B run back: its `.wandb` file, record by record, with wandb's own protobuf.

The file is a LevelDB-style log (the `:W&B` header, 32 KiB blocks, 7-byte chunk headers with a
CRC-32) of `wandb.proto.wandb_internal_pb2.Record` messages: what `wandb sync` uploads later."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
CHUNK_HEADER = 7
FILE_HEADER = b":W&B"
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def offline_runs(wandb_dir: Path) -> list[Path]:
    """The `offline-run-*` folders under a tracker's folder."""
    return sorted(wandb_dir.glob("wandb/offline-run-*"))


def records(run_dir: Path) -> Iterator[Any]:
    """Every `Record` of the run's `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    for payload in _payloads(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The rows the run logged (`run.log`), each key to its JSON-decoded value."""
    rows = []
    for record in records(run_dir):
        if record.WhichOneof("record_type") == "history":
            rows.append({_key(item): json.loads(item.value_json) for item in record.history.item})
    return rows


def config(run_dir: Path) -> dict[str, Any]:
    """The run's config as its config records set it."""
    values: dict[str, Any] = {}
    for record in records(run_dir):
        kind = record.WhichOneof("record_type")
        updates = (
            record.config.update if kind == "config" else record.run.config.update if kind == "run" else []
        )
        for item in updates:
            values[_key(item)] = json.loads(item.value_json)
    return values


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _payloads(data: bytes) -> Iterator[bytes]:
    if data[: len(FILE_HEADER)] != FILE_HEADER:
        raise ValueError("not a .wandb file: no :W&B header")
    pos, pending = CHUNK_HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:  # the rest of a block too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"chunk at {pos - length - CHUNK_HEADER}: CRC mismatch")
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
