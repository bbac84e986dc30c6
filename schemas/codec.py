"""Avro codec for STACX events: typed record <-> bytes.

Two framings, told apart by their first byte(s) on read:

* Avro single-object encoding (default): marker `C3 01`, the writer schema's 8-byte CRC-64-AVRO
  fingerprint (little-endian), then the Avro binary body.
* Confluent wire format (when a schema registry is configured): `00`, a 4-byte big-endian
  schema id, then the Avro binary body.

`encode`/`decode` work standalone for the built-in schemas (`schemas/avsc/`). A `Codec` with a
`resolver` (the Kafka schema catalogue) also reads events written with schema versions it does not
know locally, applying Avro schema resolution to the local reader schema.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, TypeVar, overload

import fastavro
from fastavro.schema import fingerprint as _avro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from stacx.schemas import records
from stacx.schemas._convert import RecordConverter, build_converters, full_name
from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.errors import CodecError, SchemaError, UnknownSchemaError

__all__ = [
    "BUILTIN_CLASSES",
    "CONFLUENT_CONTENT_TYPE",
    "CONTENT_TYPE_HEADER",
    "Codec",
    "SCHEMA_FINGERPRINT_HEADER",
    "SINGLE_OBJECT_CONTENT_TYPE",
    "SchemaInfo",
    "SchemaResolver",
    "builtin_schemas",
    "decode",
    "default_codec",
    "encode",
    "fingerprint_of",
    "load_schema",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

SINGLE_OBJECT_MARKER = b"\xc3\x01"
CONFLUENT_MAGIC = 0
_SINGLE_OBJECT_HEADER = 10

CONTENT_TYPE_HEADER = "content-type"
"""Kafka header naming an event's encoding (the CloudEvents Kafka binding's header name)."""
SCHEMA_FINGERPRINT_HEADER = "stacx-schema-fingerprint"
"""Kafka header with the writer schema's CRC-64-AVRO fingerprint (16 hex digits, as in the
schema catalogue's keys): readers can route or filter events without decoding them."""
SINGLE_OBJECT_CONTENT_TYPE = "avro/binary; framing=single-object"
"""`content-type` of an Avro single-object encoded event (Avro's media type, with the framing)."""
CONFLUENT_CONTENT_TYPE = "avro/binary; framing=confluent"
"""`content-type` of an event in the Confluent wire format (schema registry id in the value)."""
_SINGLE_OBJECT_TYPE = SINGLE_OBJECT_CONTENT_TYPE.encode()
_CONFLUENT_TYPE = CONFLUENT_CONTENT_TYPE.encode()

BUILTIN_CLASSES: dict[str, type] = {
    "stacx.Trajectory": records.Trajectory,
    "stacx.Turn": records.Turn,
    "stacx.ToolCall": records.ToolCall,
    "stacx.TrajectoryStatus": records.TrajectoryStatus,
    "stacx.TaskSample": records.TaskSample,
    "stacx.TrainingBatch": records.TrainingBatch,
    "stacx.WeightVersion": records.WeightVersion,
    "stacx.AgentInteraction": records.AgentInteraction,
    "stacx.Feedback": records.Feedback,
    "stacx.DeadLetter": records.DeadLetter,
    "stacx.ClaimCheck": ClaimCheck,
}
"""Avro full name -> Python class, for every record and enum of the built-in schemas."""

SchemaResolver = Callable[[str], "SchemaInfo | None"]
"""Looks up a writer schema by fingerprint (hex); None when unknown."""


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """One Avro schema version, parsed once."""

    name: str
    """Avro full name of the top-level record."""
    fingerprint: str
    """CRC-64-AVRO of the parsing canonical form, hex of its 8 little-endian bytes."""
    schema: dict[str, Any]
    """The schema JSON as written (defaults, aliases, docs and `dtype` attributes kept)."""
    parsed: dict[str, Any]
    """fastavro's parsed form."""

    @property
    def text(self) -> str:
        """Compact JSON as stored in the schema catalogue."""
        return json.dumps(self.schema, sort_keys=True, separators=(",", ":"))

    @property
    def aliases(self) -> tuple[str, ...]:
        ns = self.name.rpartition(".")[0] or None
        return tuple(full_name(a, ns) for a in self.schema.get("aliases", ()))


def fingerprint_of(schema: Mapping[str, Any] | str) -> str:
    """CRC-64-AVRO fingerprint (hex, little-endian byte order) of a schema."""
    return load_schema(schema).fingerprint


def load_schema(schema: Mapping[str, Any] | str) -> SchemaInfo:
    """Parse a schema given as JSON text or a dict; raises SchemaError naming the problem."""
    raw = json.loads(schema) if isinstance(schema, str) else dict(schema)
    try:
        parsed: dict[str, Any] = fastavro.parse_schema(json.loads(json.dumps(raw)))  # type: ignore[assignment]
        canonical = to_parsing_canonical_form(parsed)
    except Exception as exc:  # fastavro raises SchemaParseException, ValueError, KeyError...
        raise SchemaError(f"invalid Avro schema {raw.get('name', '?')!r}: {exc}") from exc
    name = full_name(raw["name"], raw.get("namespace"))
    return SchemaInfo(name, _avro_fingerprint(canonical, "CRC-64-AVRO"), raw, parsed)


@cache
def builtin_schemas() -> tuple[SchemaInfo, ...]:
    """The current version of every built-in schema (`schemas/avsc/*.avsc`)."""
    folder = resources.files("stacx.schemas") / "avsc"
    files = sorted((p for p in folder.iterdir() if p.name.endswith(".avsc")), key=lambda p: p.name)
    return tuple(load_schema(p.read_text(encoding="utf-8")) for p in files)


@dataclass(frozen=True, slots=True)
class _Encoder:
    info: SchemaInfo
    prefix: bytes
    to_avro: Callable[[Any], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class _DecodePlan:
    writer: dict[str, Any]
    reader: dict[str, Any] | None
    """None when the writer schema is the local one (no resolution needed)."""
    from_avro: Callable[[dict[str, Any]], Any]


class Codec:
    """Encodes local typed records and decodes any registered writer version into them.

    `schemas`/`classes` are the local (reader and writer) schemas and their Python classes;
    `resolver` finds writer schemas this codec has not seen (the Kafka catalogue);
    `on_new_schema` runs once per schema before its first encode (catalogue registration);
    `registry` switches encoding to the Confluent wire format via a SchemaRegistryClient.
    Bodies are read by fastavro (resolving an older or newer writer against the local schema).
    """

    def __init__(
        self,
        *,
        schemas: Iterable[SchemaInfo] | None = None,
        classes: Mapping[str, type] | None = None,
        resolver: SchemaResolver | None = None,
        on_new_schema: Callable[[SchemaInfo], None] | None = None,
        registry: Any | None = None,
    ) -> None:
        self._classes = dict(BUILTIN_CLASSES if classes is None else classes)
        self._local: dict[str, tuple[SchemaInfo, RecordConverter]] = {}
        for info in builtin_schemas() if schemas is None else schemas:
            self.add_local_schema(info)
        self._resolver = resolver
        self._on_new_schema = on_new_schema
        self._registry = registry
        self._writers: dict[str, SchemaInfo] = {i.fingerprint: i for i, _ in self._local.values()}
        self._encoders: dict[type, _Encoder] = {}
        self._plans: dict[bytes, _DecodePlan] = {}
        self._registry_plans: dict[int, _DecodePlan] = {}
        self._fingerprint_by_prefix: dict[bytes, bytes] = {}
        """Confluent framing prefix (magic byte, registry id) -> fingerprint, of schemas this
        codec registered."""
        self._lock = threading.Lock()

    def add_local_schema(self, info: SchemaInfo) -> None:
        """Make `info` the local (reader and writer) schema of its record type."""
        converters = build_converters(info.schema, self._classes)
        self._local[info.name] = (info, converters[info.name])

    def add_writer_schema(self, info: SchemaInfo) -> None:
        """Make a writer schema version known (e.g. one read from the catalogue)."""
        self._writers[info.fingerprint] = info

    def local_schema(self, record_type: type) -> SchemaInfo:
        """The local schema that encodes `record_type`."""
        return self._encoder(record_type).info

    def encode(self, record: object) -> bytes:
        """Serialise a record: single-object encoding, or Confluent framing with a registry."""
        enc = self._encoders.get(type(record)) or self._encoder(type(record))
        buf = io.BytesIO()
        buf.write(enc.prefix)
        try:
            fastavro.schemaless_writer(buf, enc.info.parsed, enc.to_avro(record))
        except Exception as exc:  # fastavro: ValueError/TypeError/AttributeError on bad values
            raise CodecError(f"cannot encode {type(record).__name__} as {enc.info.name}: {exc}") from exc
        return buf.getvalue()

    @overload
    def decode(self, data: bytes, expected: None = None) -> object: ...
    @overload
    def decode(self, data: bytes, expected: type[T]) -> T: ...
    def decode(self, data: bytes, expected: type[T] | None = None) -> object:
        """Deserialise an event into its local typed record (resolving older/newer writers)."""
        if type(data) is not bytes:  # array views must not alias a mutable buffer
            data = bytes(data)
        plan, offset = self._plan_for(data)
        try:
            record = self._read(plan, data, offset)
        except Exception as exc:  # truncated or corrupt body, failed resolution
            raise CodecError(f"corrupt Avro body ({type(exc).__name__}: {exc})") from exc
        if expected is not None and not isinstance(record, expected):
            raise CodecError(f"expected {expected.__name__}, got {type(record).__name__}")
        return record

    def content_headers(self, data: bytes) -> list[tuple[str, bytes]]:
        """The Kafka headers describing an encoded event: `content-type` (its framing) and
        `stacx-schema-fingerprint` (its writer schema); [] for bytes that are not an event this
        codec can tell (foreign Confluent framing, garbage)."""
        if data[:2] == SINGLE_OBJECT_MARKER and len(data) >= _SINGLE_OBJECT_HEADER:
            fingerprint = bytes(data[2:_SINGLE_OBJECT_HEADER]).hex().encode()
            return [(CONTENT_TYPE_HEADER, _SINGLE_OBJECT_TYPE), (SCHEMA_FINGERPRINT_HEADER, fingerprint)]
        known = self._fingerprint_by_prefix.get(bytes(data[:5])) if self._fingerprint_by_prefix else None
        if known is None:
            return []
        return [(CONTENT_TYPE_HEADER, _CONFLUENT_TYPE), (SCHEMA_FINGERPRINT_HEADER, known)]

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _read(plan: _DecodePlan, data: bytes, offset: int) -> object:
        buf = io.BytesIO(data)
        buf.seek(offset)
        datum: Any = fastavro.schemaless_reader(buf, plan.writer, plan.reader)
        return plan.from_avro(datum)

    def _encoder(self, record_type: type) -> _Encoder:
        with self._lock:
            if record_type in self._encoders:
                return self._encoders[record_type]
            info, conv = self._local_for_type(record_type)
            if self._on_new_schema is not None:
                self._on_new_schema(info)
            enc = _Encoder(info, self._prefix(info), conv.to_avro)
            self._encoders[record_type] = enc
            return enc

    def _local_for_type(self, record_type: type) -> tuple[SchemaInfo, RecordConverter]:
        for info, conv in self._local.values():
            if conv.cls is record_type:
                return info, conv
        raise CodecError(
            f"no schema for {record_type.__name__}: only records of schemas/avsc/ (or schemas "
            "passed to Codec(schemas=..., classes=...)) can be encoded"
        )

    def _prefix(self, info: SchemaInfo) -> bytes:
        if self._registry is None:
            return SINGLE_OBJECT_MARKER + bytes.fromhex(info.fingerprint)
        from confluent_kafka.schema_registry import Schema

        schema_id = self._registry.register_schema(info.name, Schema(info.text, "AVRO"))
        prefix = bytes([CONFLUENT_MAGIC]) + int(schema_id).to_bytes(4, "big")
        self._fingerprint_by_prefix[prefix] = info.fingerprint.encode()
        return prefix

    def _plan_for(self, data: bytes) -> tuple[_DecodePlan, int]:
        if data[:2] == SINGLE_OBJECT_MARKER and len(data) >= _SINGLE_OBJECT_HEADER:
            key = data[2:_SINGLE_OBJECT_HEADER]
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = self._build_plan(self._writer(key.hex()))
            return plan, _SINGLE_OBJECT_HEADER
        if data[:1] == b"\x00" and len(data) >= 5:
            return self._registry_plan(int.from_bytes(data[1:5], "big")), 5
        raise CodecError(
            f"not a STACX event: {len(data)} bytes starting {bytes(data[:4]).hex() or '(empty)'}; "
            "expected marker c301 (Avro single-object) or 00 (Confluent wire format)"
        )

    def _writer(self, fingerprint: str) -> SchemaInfo:
        info = self._writers.get(fingerprint)
        if info is None and self._resolver is not None:
            info = self._resolver(fingerprint)
        if info is None:
            raise UnknownSchemaError(fingerprint)
        self._writers[fingerprint] = info
        return info

    def _registry_plan(self, schema_id: int) -> _DecodePlan:
        plan = self._registry_plans.get(schema_id)
        if plan is not None:
            return plan
        if self._registry is None:
            raise CodecError(
                f"event in Confluent wire format (schema id {schema_id}) but no schema registry "
                "is configured: set schema_registry_url"
            )
        try:
            text = self._registry.get_schema(schema_id).schema_str
        except Exception as exc:
            raise UnknownSchemaError(f"registry id {schema_id}", str(exc)) from exc
        plan = self._registry_plans[schema_id] = self._build_plan(load_schema(text))
        return plan

    def _build_plan(self, writer: SchemaInfo) -> _DecodePlan:
        local = self._local.get(writer.name) or self._local_by_alias(writer.name)
        if local is None:
            raise UnknownSchemaError(writer.fingerprint, f"no local record type for {writer.name}")
        info, conv = local
        if info.fingerprint == writer.fingerprint:
            return _DecodePlan(writer.parsed, None, conv.from_avro)
        return _DecodePlan(writer.parsed, info.parsed, conv.from_avro)

    def _local_by_alias(self, name: str) -> tuple[SchemaInfo, RecordConverter] | None:
        for info, conv in self._local.values():
            if name in info.aliases:
                return info, conv
        return None


@cache
def default_codec() -> Codec:
    """A process-wide codec for the built-in schemas (no catalogue, no registry)."""
    return Codec()


def encode(record: object) -> bytes:
    """Serialise a built-in record (Avro single-object encoding)."""
    return default_codec().encode(record)


@overload
def decode(data: bytes, expected: None = None) -> object: ...
@overload
def decode(data: bytes, expected: type[T]) -> T: ...
def decode(data: bytes, expected: type[T] | None = None) -> object:
    """Deserialise a single-object encoded event written with a built-in schema."""
    return default_codec().decode(data, expected)
