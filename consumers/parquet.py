"""Events <-> Parquet: `stacx export` writes a topic range as a table that pandas and Hugging Face
`datasets` read directly; `stacx import` publishes such a table back as events.

One row per event. Every field of the record is a column: token ids, loss masks and logprobs as
lists of their numpy dtype, rewards and metadata as lists of `{key, value}` structs (Arrow maps
have no Hugging Face `datasets` type), turns as lists of structs, enums as their names. Five
`kafka_*` columns keep where the event came from (partition, offset, timestamp, key, headers:
trace context, content type), and `stacx import` publishes each event with its key, headers and
timestamp again. The column types are derived from the record dataclass, so a field added to a
schema is exported without a change here.

Records of the range that do not decode, or are no trajectory, are left out and counted
(`ExportResult`), each logged with its partition and offset.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from stacx.consumers.errors import ConsumerError
from stacx.consumers.replay import RangeRecord, ReplayRange, read_range
from stacx.producers.kafka_log import kafka_logger
from stacx.schemas.codec import Codec, encode
from stacx.schemas.records import Trajectory

__all__ = [
    "KAFKA_COLUMNS",
    "ExportResult",
    "ImportRow",
    "export_topic",
    "import_file",
    "import_rows",
    "records_from_table",
    "table_from_records",
]

log = logging.getLogger(__name__)

KAFKA_COLUMNS = ("kafka_partition", "kafka_offset", "kafka_timestamp_ms", "kafka_key", "kafka_headers")


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError as exc:  # an optional extra
        raise ConsumerError("export/import need pyarrow: `pip install pyarrow`") from exc
    return pyarrow


@cache
def arrow_schema(cls: type) -> Any:
    """The Arrow schema of record class `cls` plus the `kafka_*` columns."""
    pa = _pa()
    fields = [pa.field(f.name, _arrow_type(cls, f)) for f in dataclasses.fields(cls)]
    kafka = [
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("kafka_timestamp_ms", pa.int64()),
        pa.field("kafka_key", pa.binary()),
        pa.field("kafka_headers", _pairs(pa.string(), pa.binary())),
    ]
    return pa.schema(fields + kafka)


def _arrow_type(owner: type, f: dataclasses.Field[Any]) -> Any:
    hint = typing.get_type_hints(owner)[f.name]
    if f.default_factory is not dataclasses.MISSING:
        sample = f.default_factory()
        if isinstance(sample, np.ndarray):
            return _pa().list_(_pa().from_numpy_dtype(sample.dtype))
    return _hint_type(hint)


def _hint_type(hint: Any) -> Any:
    pa = _pa()
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return _hint_type(inner)
    if origin is list:
        return pa.list_(_hint_type(args[0]))
    if origin is dict:
        return _pairs(_hint_type(args[0]), _hint_type(args[1]))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return pa.struct([pa.field(f.name, _arrow_type(hint, f)) for f in dataclasses.fields(hint)])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return pa.string()
    simple = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(), bytes: pa.binary()}
    if hint in simple:
        return simple[hint]
    raise ConsumerError(f"no Parquet column type for {hint!r}")


def _pairs(key: Any, value: Any) -> Any:
    """A mapping's column type: a list of `{key, value}` structs, in insertion order."""
    pa = _pa()
    return pa.list_(pa.struct([pa.field("key", key), pa.field("value", value)]))


def _items(value: Any) -> list[tuple[Any, Any]]:
    """(key, value) pairs of a mapping column's cell: `{key, value}` structs, or the tuples of
    an Arrow map (files written before mappings were struct lists)."""
    return [(v["key"], v["value"]) if isinstance(v, dict) else (v[0], v[1]) for v in value or []]


def _to_plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return [{"key": k, "value": _to_plain(v)} for k, v in value.items()]
    return value


def _from_plain(cls: type, row: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = row[f.name]
        if f.default_factory is not dataclasses.MISSING and isinstance(
            sample := f.default_factory(), np.ndarray
        ):
            kwargs[f.name] = np.asarray(value, dtype=sample.dtype)
        else:
            kwargs[f.name] = _value(hints[f.name], value)
    return cls(**kwargs)


def _value(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value)
    if origin is list:
        return [_value(args[0], v) for v in value]
    if origin is dict:
        return {k: _value(args[1], v) for k, v in _items(value)}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _from_plain(hint, value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    return value


def table_from_records(records: Iterable[tuple[RangeRecord, Any]], cls: type = Trajectory) -> Any:
    """An Arrow table: one row per (source record, decoded event)."""
    rows = []
    for source, event in records:
        row = {f.name: _to_plain(getattr(event, f.name)) for f in dataclasses.fields(cls)}
        row.update(
            kafka_partition=source.partition,
            kafka_offset=source.offset,
            kafka_timestamp_ms=source.timestamp_ms,
            kafka_key=source.key,
            kafka_headers=[{"key": k, "value": v} for k, v in source.headers],
        )
        rows.append(row)
    return _pa().Table.from_pylist(rows, schema=arrow_schema(cls))


@dataclass(frozen=True, slots=True)
class ImportRow:
    """One row of an exported table: the event and how it was stored in Kafka."""

    event: Any
    key: bytes | None
    partition: int | None
    timestamp_ms: int | None
    headers: list[tuple[str, bytes | None]]


def import_rows(table: Any, cls: type = Trajectory) -> list[ImportRow]:
    """The rows of a table `table_from_records` wrote (tables without the `kafka_*` columns are
    read too: their events get no key, partition, timestamp or headers)."""
    missing = {f.name for f in dataclasses.fields(cls)} - set(table.column_names)
    if missing:
        raise ConsumerError(f"the table has no column(s) {sorted(missing)} of {cls.__name__}")
    return [
        ImportRow(
            event=_from_plain(cls, row),
            key=row.get("kafka_key"),
            partition=row.get("kafka_partition"),
            timestamp_ms=row.get("kafka_timestamp_ms"),
            headers=_items(row.get("kafka_headers")),
        )
        for row in table.to_pylist()
    ]


def records_from_table(table: Any, cls: type = Trajectory) -> list[tuple[bytes | None, Any]]:
    """(Kafka key, event) per row of a table `table_from_records` wrote."""
    return [(row.key, row.event) for row in import_rows(table, cls)]


@dataclass(kw_only=True, slots=True)
class ExportResult:
    """What `export_topic` wrote and what it left out."""

    rows: int = 0
    undecodable: int = 0
    """Records that are no event this codec can read (each logged with its coordinates)."""
    other_records: int = 0
    """Events of other types than Trajectory."""
    first_undecodable: str = ""
    """Where the first undecodable record is and why (`partition P offset O: reason`)."""


def export_topic(
    bootstrap: str, spec: ReplayRange, dest: Path, *, codec: Codec | None = None
) -> ExportResult:
    """Write the trajectories of `spec`'s range to the Parquet file `dest`."""
    import pyarrow.parquet as pq

    codec = codec or Codec()
    result = ExportResult()
    decoded = []
    for record in read_range(bootstrap, spec):
        try:
            event = codec.decode(record.value)
        except Exception as exc:  # untrusted bytes: left out and counted, as a replay does
            where = f"partition {record.partition} offset {record.offset}: {exc}"
            log.warning("export: undecodable record of %s at %s", spec.topic, where)
            result.undecodable += 1
            result.first_undecodable = result.first_undecodable or where
            continue
        if isinstance(event, Trajectory):
            decoded.append((record, event))
        else:
            result.other_records += 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table_from_records(decoded), dest)
    result.rows = len(decoded)
    return result


def import_file(bootstrap: str, source: Path, topic: str) -> int:
    """Publish every row of the Parquet file `source` to `topic` as an event, with the key,
    headers and timestamp it was exported with (else keyed by group id), to the partition it
    came from when `topic` has that many partitions (else by key); returns the count."""
    import pyarrow.parquet as pq
    from confluent_kafka import Producer

    rows = import_rows(pq.read_table(source))
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "logger": kafka_logger(),
        }
    )
    keep_partitions = _fits(producer, topic, rows)
    for row in rows:
        extra: dict[str, Any] = {}
        if keep_partitions and row.partition is not None:
            extra["partition"] = row.partition
        if row.timestamp_ms is not None and row.timestamp_ms > 0:
            extra["timestamp"] = row.timestamp_ms
        if row.headers:
            extra["headers"] = row.headers
        producer.produce(topic, key=row.key or row.event.group_id.encode(), value=encode(row.event), **extra)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise ConsumerError(f"could not publish every row of {source} to {topic} within 60 s")
    return len(rows)


def _fits(producer: Any, topic: str, rows: list[ImportRow]) -> bool:
    """Whether `topic` has every partition the rows were exported from."""
    wanted = max((r.partition for r in rows if r.partition is not None), default=None)
    if wanted is None:
        return False
    meta = producer.list_topics(timeout=30).topics.get(topic)  # all topics: naming one may create it
    return meta is not None and meta.error is None and wanted < len(meta.partitions)
