"""Compile converters between typed records (dataclasses) and the dicts fastavro reads and writes.

Converters are built once per schema from the Avro JSON: numpy arrays travel as packed
little-endian `bytes` (the field attribute `dtype` names the numpy dtype), enums as their symbol,
nested records recursively. Everything else passes through untouched, so the per-record cost is
one dict build plus one `tobytes()` / `np.frombuffer` per array.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Convert = Callable[[Any], Any]

__all__ = ["Convert", "RecordConverter", "build_converters", "full_name"]

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


@dataclass(frozen=True, slots=True)
class RecordConverter:
    """Both directions for one Avro record type."""

    name: str
    """Avro full name."""
    cls: type
    """Python class the record maps to."""
    to_avro: Callable[[Any], dict[str, Any]]
    """Record object -> dict for fastavro."""
    from_avro: Callable[[dict[str, Any]], Any]
    """Dict from fastavro (already resolved to the reader schema) -> record object."""


def full_name(name: str, namespace: str | None) -> str:
    """Avro full name of `name` declared inside `namespace`."""
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def build_converters(schema: Mapping[str, Any], classes: Mapping[str, type]) -> dict[str, RecordConverter]:
    """Converters for every record declared in `schema`, keyed by Avro full name.

    `classes` maps Avro full names (records and enums) to Python classes; a record without a
    class is an error naming the record and the fix.
    """
    builder = _Builder(classes)
    builder.convert_type(schema, None)
    return builder.records


class _Builder:
    def __init__(self, classes: Mapping[str, type]) -> None:
        self.classes = classes
        self.records: dict[str, RecordConverter] = {}
        self.enums: dict[str, type | None] = {}

    def convert_type(
        self, avro: Any, namespace: str | None, dtype: str | None = None
    ) -> tuple[Convert | None, Convert | None]:
        """(to_avro, from_avro) for one Avro type; None where the value passes through."""
        if isinstance(avro, list):
            return self._union(avro, namespace, dtype)
        if isinstance(avro, str):
            return self._named_or_primitive(avro, namespace, dtype)
        kind = avro["type"]
        if kind == "record":
            return self._record(avro, namespace)
        if kind == "enum":
            return self._enum(avro, namespace)
        if kind == "array":
            return _lift_list(*self.convert_type(avro["items"], namespace))
        if kind == "map":
            return _lift_map(*self.convert_type(avro["values"], namespace))
        if kind in _PRIMITIVES:
            return self._named_or_primitive(kind, namespace, dtype)
        return None, None  # fixed: passes through as bytes

    def _named_or_primitive(
        self, name: str, namespace: str | None, dtype: str | None
    ) -> tuple[Convert | None, Convert | None]:
        if name == "bytes" and dtype:
            return _array_codec(dtype)
        if name in _PRIMITIVES:
            return None, None
        fname = full_name(name, namespace)
        if fname in self.records:
            conv = self.records[fname]
            return conv.to_avro, conv.from_avro
        if fname in self.enums:
            return _enum_codec(self.enums[fname])
        raise ValueError(f"schema refers to {fname!r} before defining it")

    def _union(
        self, branches: list[Any], namespace: str | None, dtype: str | None
    ) -> tuple[Convert | None, Convert | None]:
        non_null = [b for b in branches if b != "null"]
        if len(non_null) != 1:
            return None, None  # general unions pass through (none in the built-in schemas)
        to_fn, from_fn = self.convert_type(non_null[0], namespace, dtype)
        return _optional(to_fn), _optional(from_fn)

    def _enum(self, avro: Mapping[str, Any], namespace: str | None) -> tuple[Convert | None, Convert | None]:
        fname = full_name(avro["name"], avro.get("namespace", namespace))
        self.enums[fname] = self.classes.get(fname)
        return _enum_codec(self.enums[fname])

    def _record(self, avro: Mapping[str, Any], namespace: str | None) -> tuple[Convert, Convert]:
        ns = avro.get("namespace", namespace)
        fname = full_name(avro["name"], ns)
        if fname in self.records:  # redefinition: tolerated, same converter
            conv = self.records[fname]
            return conv.to_avro, conv.from_avro
        cls = self.classes.get(fname)
        if cls is None:
            raise ValueError(
                f"no Python class for Avro record {fname!r}: pass it in `classes` (full name -> class)"
            )
        ns = fname.rpartition(".")[0] or None
        fields = [(f["name"], *self.convert_type(f["type"], ns, f.get("dtype"))) for f in avro["fields"]]
        conv = RecordConverter(fname, cls, _record_to_avro(fields), _record_from_avro(cls, fields))
        self.records[fname] = conv
        return conv.to_avro, conv.from_avro


def _record_to_avro(
    fields: list[tuple[str, Convert | None, Convert | None]],
) -> Callable[[Any], dict[str, Any]]:
    plain = tuple(name for name, to_fn, _ in fields if to_fn is None)
    converted = tuple((name, to_fn) for name, to_fn, _ in fields if to_fn is not None)

    def to_avro(record: Any) -> dict[str, Any]:
        out = {name: getattr(record, name) for name in plain}
        for name, fn in converted:
            out[name] = fn(getattr(record, name))
        return out

    return to_avro


def _record_from_avro(
    cls: type, fields: list[tuple[str, Convert | None, Convert | None]]
) -> Callable[[dict[str, Any]], Any]:
    converted = tuple((name, from_fn) for name, _, from_fn in fields if from_fn is not None)

    def from_avro(datum: dict[str, Any]) -> Any:
        for name, fn in converted:
            datum[name] = fn(datum[name])
        return cls(**datum)

    return from_avro


def _array_codec(dtype: str) -> tuple[Convert, Convert]:
    dt = np.dtype(dtype)

    def to_bytes(array: Any) -> bytes:
        return np.asarray(array, dtype=dt).tobytes()

    def from_bytes(data: bytes) -> Any:
        return np.frombuffer(data, dtype=dt)

    return to_bytes, from_bytes


def _enum_codec(cls: type | None) -> tuple[Convert, Convert | None]:
    def to_symbol(value: Any) -> Any:
        return value.value if isinstance(value, enum.Enum) else value

    if cls is None or not issubclass(cls, enum.Enum):
        return to_symbol, cls
    by_symbol = {member.value: member for member in cls}
    return to_symbol, by_symbol.__getitem__


def _optional(fn: Convert | None) -> Convert | None:
    if fn is None:
        return None
    return lambda value: None if value is None else fn(value)


def _lift_list(to_fn: Convert | None, from_fn: Convert | None) -> tuple[Convert | None, Convert | None]:
    return (
        (lambda values: [to_fn(v) for v in values]) if to_fn else None,
        (lambda values: [from_fn(v) for v in values]) if from_fn else None,
    )


def _lift_map(to_fn: Convert | None, from_fn: Convert | None) -> tuple[Convert | None, Convert | None]:
    return (
        (lambda values: {k: to_fn(v) for k, v in values.items()}) if to_fn else None,
        (lambda values: {k: from_fn(v) for k, v in values.items()}) if from_fn else None,
    )
