"""Events <-> Parquet: `stacx export` writes a topic range as a table that pandas and Hugging Face
`datasets` read directly; `stacx import` publishes such a table back as events.

One row per event. Every field of the record is a column: token ids, loss masks and logprobs as
lists of their numpy dtype, rewards and metadata as maps, turns as lists of structs, enums as
their names. Four `kafka_*` columns keep where the event came from (partition, offset,
timestamp, key). The column types are derived from the record dataclass, so a field added to a
schema is exported without a change here.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from consumers.errors import ConsumerError
from consumers.replay import RangeRecord, ReplayRange, read_range
from schemas.codec import Codec, encode
from schemas.records import Trajectory

__all__ = ["KAFKA_COLUMNS", "export_topic", "import_file", "records_from_table", "table_from_records"]

KAFKA_COLUMNS = ("kafka_partition", "kafka_offset", "kafka_timestamp_ms", "kafka_key")


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
        return pa.map_(_hint_type(args[0]), _hint_type(args[1]))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return pa.struct([pa.field(f.name, _arrow_type(hint, f)) for f in dataclasses.fields(hint)])
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return pa.string()
    simple = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(), bytes: pa.binary()}
    if hint in simple:
        return simple[hint]
    raise ConsumerError(f"no Parquet column type for {hint!r}")


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
        return [(k, _to_plain(v)) for k, v in value.items()]  # Arrow maps keep insertion order
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
        return {k: _value(args[1], v) for k, v in value}
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
        )
        rows.append(row)
    return _pa().Table.from_pylist(rows, schema=arrow_schema(cls))


def records_from_table(table: Any, cls: type = Trajectory) -> list[tuple[bytes | None, Any]]:
    """(Kafka key, event) per row of a table `table_from_records` wrote."""
    missing = {f.name for f in dataclasses.fields(cls)} - set(table.column_names)
    if missing:
        raise ConsumerError(f"the table has no column(s) {sorted(missing)} of {cls.__name__}")
    out = []
    for row in table.to_pylist():
        out.append((row.get("kafka_key"), _from_plain(cls, row)))
    return out


def export_topic(bootstrap: str, spec: ReplayRange, dest: Path, *, codec: Codec | None = None) -> int:
    """Write the trajectories of `spec`'s range to the Parquet file `dest`; rows written."""
    import pyarrow.parquet as pq

    codec = codec or Codec()
    decoded = []
    for record in read_range(bootstrap, spec):
        event = codec.decode(record.value)
        if isinstance(event, Trajectory):
            decoded.append((record, event))
    dest.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table_from_records(decoded), dest)
    return len(decoded)


def import_file(bootstrap: str, source: Path, topic: str) -> int:
    """Publish every row of the Parquet file `source` to `topic` as an event (keyed as
    exported, else by group id); returns the count."""
    import pyarrow.parquet as pq
    from confluent_kafka import Producer

    rows = records_from_table(pq.read_table(source))
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "lz4"}
    )
    for key, event in rows:
        producer.produce(topic, key=key or event.group_id.encode(), value=encode(event))
        producer.poll(0)
    if producer.flush(60) != 0:
        raise ConsumerError(f"could not publish every row of {source} to {topic} within 60 s")
    return len(rows)
