"""The compiled reader (schemas/_reader.py): zero-copy array views, and the same records as the
generic fastavro path, which these tests use as the independent reference.

Every test runs twice: the generated source run by Python, and the same source compiled to C
with Cython (schemas/_native.py), which is what a Codec uses by default."""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Any

import fastavro
import numpy as np
import pytest
from events_strategies import RECORDS, comparable, trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas._convert import build_converters
from schemas._reader import Reader
from schemas._reader import compile_reader as _compile_reader
from schemas.codec import BUILTIN_CLASSES, Codec, builtin_schemas, encode, load_schema
from schemas.errors import CodecError
from schemas.records import Trajectory, Turn, logprobs, loss_mask, token_ids

HEADER = 10  # single-object marker + fingerprint
CODECS = {"python": Codec(native_readers=False), "native": Codec()}
_native = True


@pytest.fixture(autouse=True, params=["python", "native"])
def reader_kind(request: pytest.FixtureRequest) -> str:
    """Each test once per kind of reader: `compile_reader` and `default_codec` follow it."""
    global _native
    _native = request.param == "native"
    return str(request.param)


def compile_reader(schema: dict[str, Any], classes: dict[str, type]) -> Reader:
    return _compile_reader(schema, classes, native=_native)


def default_codec() -> Codec:
    return CODECS["native" if _native else "python"]


def reference_decode(data: bytes) -> Any:
    """fastavro's generic reader + the dict converters: no compiled code involved."""
    info = default_codec().writer_info(data)
    assert info is not None
    datum = fastavro.schemaless_reader(io.BytesIO(data[HEADER:]), info.parsed, None)
    return build_converters(info.schema, BUILTIN_CLASSES)[info.name].from_avro(datum)


def long_trajectory() -> tuple[Trajectory, bytes]:
    rng = np.random.default_rng(7)
    record = trajectory(
        3,
        token_ids=token_ids(rng.integers(0, 150_000, 5000)),
        loss_mask=loss_mask(rng.integers(0, 2, 5000)),
        logprobs=logprobs(-rng.exponential(1.0, 5000)),
        turns=[Turn(role="assistant", text="é" * 3000, policy_version=-(2**40))],
        rewards={f"r{i}": float(i) for i in range(300)},  # a map longer than a one-byte count
        created_at_ms=2**62,
    )
    return record, encode(record)


@pytest.mark.parametrize("record_type", list(RECORDS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_record_type_reads_like_the_generic_reader(record_type: type, data: st.DataObject) -> None:
    record = data.draw(RECORDS[record_type])
    encoded = encode(record)
    assert comparable(default_codec().decode(encoded)) == comparable(reference_decode(encoded))


def test_long_fields_and_multibyte_varints() -> None:
    record, encoded = long_trajectory()
    decoded = default_codec().decode(encoded, Trajectory)
    assert comparable(decoded) == comparable(reference_decode(encoded))
    assert decoded.created_at_ms == 2**62 and decoded.turns[0].policy_version == -(2**40)
    np.testing.assert_array_equal(decoded.token_ids, record.token_ids)
    np.testing.assert_array_equal(decoded.logprobs, record.logprobs)


def test_packed_arrays_are_read_only_views_over_the_event_bytes() -> None:
    _, encoded = long_trajectory()
    decoded = default_codec().decode(encoded, Trajectory)
    event = np.frombuffer(encoded, np.uint8)
    for array in (decoded.token_ids, decoded.loss_mask, decoded.logprobs):
        assert np.shares_memory(array, event), "a packed array was copied"
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    assert decoded.token_ids.dtype == np.dtype("<i4") and decoded.logprobs.dtype == np.dtype("<f4")


def test_a_mutable_buffer_is_copied_first_so_views_never_alias_it() -> None:
    record, encoded = long_trajectory()
    buffer = bytearray(encoded)
    decoded = default_codec().decode(buffer, Trajectory)  # type: ignore[arg-type]
    buffer[:] = bytes(len(buffer))
    assert not decoded.token_ids.flags.writeable
    np.testing.assert_array_equal(decoded.token_ids, record.token_ids)


@pytest.mark.parametrize("cut", [HEADER + 5, -1, -4000, -30_000])
def test_truncated_events_raise_codec_errors(cut: int) -> None:
    _, encoded = long_trajectory()
    with pytest.raises(CodecError, match="corrupt Avro body"):
        default_codec().decode(encoded[:cut])


def test_a_negative_length_is_corrupt_not_a_whole_buffer_view() -> None:
    schema = {"type": "record", "name": "Packed", "namespace": "t",
              "fields": [{"name": "xs", "type": "bytes", "dtype": "<i4"}]}  # fmt: skip
    reader = compile_reader(schema, {"t.Packed": _Packed})
    with pytest.raises(ValueError, match="does not fit"):
        reader(b"\x07" + bytes(40), 0)  # zig-zag 7 = length -4: frombuffer would read it all
    with pytest.raises(ValueError, match="does not fit"):
        reader(b"\x06" + bytes(40), 0)  # 3 bytes: not a whole number of int32


class _Packed:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def test_array_blocks_with_byte_sizes_are_read() -> None:
    """Avro lets writers prefix a block with a negative count and its byte size."""
    schema = {"type": "record", "name": "Packed", "namespace": "t",
              "fields": [{"name": "xs", "type": {"type": "array", "items": "long"}},
                         {"name": "tail", "type": "string"}]}  # fmt: skip
    body = bytes([3, 4, 2, 4, 2, 0x80, 0x01, 0]) + b"\x04ok"  # -2 items (2 bytes): 1, 2; 1 item: 64
    record, end = compile_reader(schema, {"t.Packed": _Packed})(body, 0)
    expected = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(schema), None)
    assert record.xs == expected["xs"] == [1, 2, 64] and record.tail == expected["tail"] == "ok"
    assert end == len(body)


def test_floats_and_fixed() -> None:
    schema = {"type": "record", "name": "Mixed", "namespace": "t",
              "fields": [{"name": "f", "type": "float"}, {"name": "flag", "type": "boolean"},
                         {"name": "h", "type": {"type": "fixed", "name": "H", "size": 3}},
                         {"name": "again", "type": "H"}]}  # fmt: skip
    body = struct.pack("<f", 1.5) + b"\x01" + b"abc" + b"xyz"
    record, _ = compile_reader(schema, {"t.Mixed": _Packed})(body, 0)
    assert (record.f, record.flag, record.h, record.again) == (1.5, True, b"abc", b"xyz")


def test_older_writers_still_resolve_through_the_generic_path() -> None:
    info = next(i for i in builtin_schemas() if i.name == "stacx.Trajectory")
    older = dict(info.schema, fields=[f for f in info.schema["fields"] if f["name"] != "temperature"])
    older_info = load_schema(older)
    codec = type(default_codec())()
    codec.add_writer_schema(older_info)
    datum = build_converters(info.schema, BUILTIN_CLASSES)[info.name].to_avro(trajectory(1))
    del datum["temperature"]
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + bytes.fromhex(older_info.fingerprint))
    fastavro.schemaless_writer(buf, older_info.parsed, datum)
    decoded = codec.decode(buf.getvalue(), Trajectory)
    assert decoded.temperature == 1.0 and decoded.trajectory_id == "traj-1"


def test_a_field_named_like_a_python_keyword() -> None:
    schema = {"type": "record", "name": "K", "namespace": "t",
              "fields": [{"name": "class", "type": "string"}, {"name": "ok", "type": "long"}]}  # fmt: skip
    record, _ = compile_reader(schema, {"t.K": _Packed})(b"\x04ab\x06", 0)
    assert getattr(record, "class") == "ab" and record.ok == 3


@dataclasses.dataclass(kw_only=True, slots=True)
class _Checked:
    xs: np.ndarray
    n: int

    def __post_init__(self) -> None:
        self.n = self.n * 10  # stands for any work __init__ does besides storing fields


def test_a_record_with_post_init_is_built_through_its_constructor() -> None:
    """Only a dataclass whose __init__ merely stores the fields gets them stored directly."""
    fields = [{"name": "xs", "type": "bytes", "dtype": "<i4"}, {"name": "n", "type": "long"}]
    schema = {"type": "record", "name": "C", "namespace": "t", "fields": fields}
    record, _ = compile_reader(schema, {"t.C": _Checked})(b"\x00\x06", 0)
    assert record.n == 30 and len(record.xs) == 0


def test_empty_packed_arrays_are_read_only_and_typed() -> None:
    empty = trajectory(1, token_ids=token_ids([]), loss_mask=loss_mask([]), logprobs=logprobs([]))
    decoded = default_codec().decode(encode(empty), Trajectory)
    for array, dtype in ((decoded.token_ids, "<i4"), (decoded.loss_mask, "u1"), (decoded.logprobs, "<f4")):
        assert array.shape == (0,) and array.dtype == np.dtype(dtype) and not array.flags.writeable


def test_a_recursive_record_reads_through_a_call_of_its_own_function() -> None:
    """Nested records are read inline; one that contains itself cannot be, and still reads."""
    schema = {"type": "record", "name": "Node", "namespace": "t",
              "fields": [{"name": "label", "type": "string"},
                         {"name": "children", "type": {"type": "array", "items": "Node"}},
                         {"name": "next", "type": ["null", "Node"]}]}  # fmt: skip
    datum = {"label": "a", "children": [{"label": "b", "children": [], "next": None}],
             "next": {"label": "c", "children": [], "next": None}}  # fmt: skip
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), datum)
    record, end = compile_reader(schema, {"t.Node": _Packed})(buf.getvalue(), 0)
    assert (record.label, record.children[0].label, record.next.label) == ("a", "b", "c")
    assert record.children[0].children == [] and record.next.next is None and end == len(buf.getvalue())


@pytest.mark.parametrize(
    "prefix",
    [b"\x01", b"\x81\x01", b"\xff\x7f", b"\x81\x80\x01", b"\xff\xff\xff\x7f"],
    ids=["one-byte", "two-byte", "two-byte-largest", "three-byte", "four-byte"],
)
def test_a_negative_length_of_any_width_is_corrupt(prefix: bytes) -> None:
    schema = {"type": "record", "name": "S", "namespace": "t",
              "fields": [{"name": "s", "type": "string"}]}  # fmt: skip
    with pytest.raises(ValueError, match="does not fit"):
        compile_reader(schema, {"t.S": _Packed})(prefix + bytes(20_000), 0)


@pytest.mark.parametrize("value", [0, -1, 63, -64, 64, -65, 8191, -8192, 8192, 2**40, -(2**62), 2**63 - 1])
def test_longs_of_every_varint_width(value: int) -> None:
    schema = {"type": "record", "name": "L", "namespace": "t",
              "fields": [{"name": "v", "type": "long"},
                         {"name": "xs", "type": {"type": "array", "items": "long"}},
                         {"name": "m", "type": {"type": "map", "values": "long"}}]}  # fmt: skip
    for xs, m in (([], {}), ([value, 1], {"k": value})):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), {"v": value, "xs": xs, "m": m})
        record, end = compile_reader(schema, {"t.L": _Packed})(buf.getvalue(), 0)
        assert (record.v, record.xs, record.m, end) == (value, xs, m, len(buf.getvalue()))


class _Other(_Packed):
    pass


def test_readers_of_one_schema_for_different_classes_stay_apart() -> None:
    """Compiled readers of the same source share one C module: not its bindings."""
    schema = {"type": "record", "name": "Twice", "namespace": "t",
              "fields": [{"name": "s", "type": "string"}]}  # fmt: skip
    first = compile_reader(schema, {"t.Twice": _Packed})
    second = compile_reader(schema, {"t.Twice": _Other})
    assert type(first(b"\x02a", 0)[0]) is _Packed and type(second(b"\x02b", 0)[0]) is _Other
