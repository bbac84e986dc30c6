"""Codec round trips for every schema, framing, and error reporting."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from events_strategies import RECORDS, comparable, trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from stacx.schemas.codec import BUILTIN_CLASSES, builtin_schemas, decode, default_codec, encode
from stacx.schemas.errors import CodecError, UnknownSchemaError
from stacx.schemas.records import Trajectory, Turn, logprobs, loss_mask, token_ids


@pytest.mark.parametrize("record_type", list(RECORDS), ids=lambda t: t.__name__)
def test_round_trip_every_schema(record_type: type) -> None:
    @settings(max_examples=40, deadline=None)
    @given(RECORDS[record_type])
    def check(record: object) -> None:
        data = encode(record)
        assert data[:2] == b"\xc3\x01"
        assert data[2:10].hex() == default_codec().local_schema(record_type).fingerprint
        assert comparable(decode(data, record_type)) == comparable(record)

    check()


def test_every_builtin_schema_matches_its_dataclass() -> None:
    for info in builtin_schemas():
        cls = BUILTIN_CLASSES[info.name]
        schema_fields = [f["name"] for f in info.schema["fields"]]
        assert schema_fields == [f.name for f in dataclasses.fields(cls)], info.name


def test_token_arrays_travel_as_packed_little_endian_bytes() -> None:
    ids = np.arange(2000, dtype=np.int32)
    t = trajectory(token_ids=ids, loss_mask=loss_mask(np.ones(2000)), logprobs=logprobs(np.zeros(2000)))
    data = encode(t)
    assert ids.astype("<i4").tobytes() in data
    assert 2000 * 9 < len(data) < 2000 * 9 + 200  # 4 + 1 + 4 bytes per token, no boxing
    back = decode(data, Trajectory)
    assert back.token_ids.dtype == np.int32 and np.array_equal(back.token_ids, ids)


def test_python_lists_are_accepted_for_arrays() -> None:
    t = trajectory(turns=[Turn(role="user", text="hi", token_ids=[1, 2])])
    assert decode(encode(t), Trajectory).turns[0].token_ids.tolist() == [1, 2]


@settings(deadline=None)
@given(st.binary(max_size=64))
def test_garbage_raises_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode(data)


def test_unknown_fingerprint_names_it() -> None:
    data = b"\xc3\x01" + bytes(8) + b"\x00"
    with pytest.raises(UnknownSchemaError, match="0000000000000000"):
        decode(data)


def test_truncated_body_is_a_codec_error() -> None:
    data = encode(trajectory(token_ids=token_ids([1])))
    with pytest.raises(CodecError, match="corrupt"):
        decode(data[:20])


def test_expected_type_mismatch() -> None:
    data = encode(trajectory())
    with pytest.raises(CodecError, match="expected Turn"):
        decode(data, Turn)


def test_unencodable_type_is_named() -> None:
    with pytest.raises(CodecError, match="no schema for dict"):
        encode({"a": 1})
