"""Schema evolution: Avro resolution between versions, and the compatibility check."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest

from stacx.schemas.codec import Codec, SchemaInfo, builtin_schemas, load_schema
from stacx.schemas.compat import Compatibility, check_compatibility, compatibility_problems, reader_problems
from stacx.schemas.errors import CodecError, IncompatibleSchemaError, UnknownSchemaError
from stacx.schemas.records import Trajectory, WeightVersion

V1 = {
    "type": "record",
    "name": "Item",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "count", "type": "int", "default": 0},
    ],
}
V2_ADDED = copy.deepcopy(V1)
V2_ADDED["fields"].append({"name": "note", "type": "string", "default": "none"})
V3_REMOVED = {
    "type": "record",
    "name": "Item",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "string"},
    ],
}
V4_RENAMED = {
    "type": "record",
    "name": "Item",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "quantity", "type": "int", "aliases": ["count"], "default": 0},
    ],
}
V5_RETYPED = {
    "type": "record",
    "name": "Item",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "count", "type": "string"},
    ],
}
V6_REQUIRED = copy.deepcopy(V1)
V6_REQUIRED["fields"].append({"name": "owner", "type": "string"})


@dataclass(kw_only=True, slots=True)
class ItemV1:
    id: str
    count: int = 0


@dataclass(kw_only=True, slots=True)
class ItemV2:
    id: str
    count: int = 0
    note: str = "none"


@dataclass(kw_only=True, slots=True)
class ItemV3:
    id: str


@dataclass(kw_only=True, slots=True)
class ItemV4:
    id: str
    quantity: int = 0


@dataclass(kw_only=True, slots=True)
class ItemV5:
    id: str
    count: str


def codec(schema: dict, cls: type, *writers: dict) -> Codec:
    c = Codec(schemas=[load_schema(schema)], classes={"test.Item": cls})
    for w in writers:
        c.add_writer_schema(load_schema(w))
    return c


def transfer(writer: tuple[dict, type, object], reader: tuple[dict, type]) -> object:
    data = codec(writer[0], writer[1]).encode(writer[2])
    return codec(reader[0], reader[1], writer[0]).decode(data)


def test_added_field_with_default_both_directions() -> None:
    assert transfer((V1, ItemV1, ItemV1(id="a", count=3)), (V2_ADDED, ItemV2)) == ItemV2(id="a", count=3)
    old = transfer((V2_ADDED, ItemV2, ItemV2(id="a", count=3, note="n")), (V1, ItemV1))
    assert old == ItemV1(id="a", count=3)
    assert compatibility_problems(V2_ADDED, [V1], Compatibility.FULL) == []


def test_removed_field_both_directions() -> None:
    assert transfer((V1, ItemV1, ItemV1(id="a", count=3)), (V3_REMOVED, ItemV3)) == ItemV3(id="a")
    assert transfer((V3_REMOVED, ItemV3, ItemV3(id="a")), (V1, ItemV1)) == ItemV1(id="a", count=0)
    assert compatibility_problems(V3_REMOVED, [V1], Compatibility.FULL) == []


def test_renamed_field_via_alias() -> None:
    assert transfer((V1, ItemV1, ItemV1(id="a", count=7)), (V4_RENAMED, ItemV4)) == ItemV4(id="a", quantity=7)
    check_compatibility(V4_RENAMED, [V1], Compatibility.BACKWARD)


def test_incompatible_type_change_is_rejected() -> None:
    with pytest.raises(IncompatibleSchemaError, match="count: writer int cannot be read as string"):
        check_compatibility(V5_RETYPED, [V1], Compatibility.BACKWARD)
    with pytest.raises(CodecError):
        transfer((V1, ItemV1, ItemV1(id="a", count=7)), (V5_RETYPED, ItemV5))


def test_new_required_field_is_rejected_against_every_version() -> None:
    problems = compatibility_problems(V6_REQUIRED, [V1, V2_ADDED], Compatibility.BACKWARD)
    assert len(problems) == 2 and all("owner" in p and "no default" in p for p in problems)


def test_forward_mode_checks_old_readers() -> None:
    assert compatibility_problems(V6_REQUIRED, [V1], Compatibility.FORWARD) == []
    assert compatibility_problems(V3_REMOVED, [V6_REQUIRED], Compatibility.FORWARD) != []


def test_promotions_and_unions() -> None:
    assert reader_problems("long", "int") == []
    assert reader_problems("int", "long") != []
    assert reader_problems(["null", "string"], "string") == []
    assert reader_problems("string", ["null", "string"]) != []


def test_builtin_schemas_are_compatible_with_themselves() -> None:
    for info in builtin_schemas():
        assert compatibility_problems(info.schema, [info.schema], Compatibility.FULL) == [], info.name


def _older_trajectory() -> SchemaInfo:
    current = next(i for i in builtin_schemas() if i.name == "stacx.Trajectory")
    older = copy.deepcopy(current.schema)
    older["fields"] = [f for f in older["fields"] if f["name"] not in {"prompt_length", "error"}]
    return load_schema(older)


def test_current_reader_resolves_an_older_trajectory_writer_through_a_resolver() -> None:
    older = _older_trajectory()
    writer = Codec(schemas=[older])
    record = Trajectory(
        trajectory_id="t",
        group_id="g",
        sample_index=1,
        task_id="k",
        task_type="x",
        model_name="m",
        policy_version=2,
        prompt_length=5,
    )
    data = writer.encode(record)
    assert data[2:10].hex() == older.fingerprint
    with pytest.raises(UnknownSchemaError):
        Codec().decode(data)
    reader = Codec(resolver={older.fingerprint: older}.get)
    back = reader.decode(data, Trajectory)
    assert back.trajectory_id == "t" and back.prompt_length == 0 and back.error is None


def _without(name: str, fields: set[str]) -> SchemaInfo:
    current = next(i for i in builtin_schemas() if i.name == name)
    older = copy.deepcopy(current.schema)
    older["fields"] = [f for f in older["fields"] if f["name"] not in fields]
    return load_schema(older)


def test_sampling_fields_evolve_both_ways() -> None:
    """`Trajectory.temperature` and `TrainingBatch.temperatures` / `logprobs_recorded` were added
    with defaults: events of older writers read as T = 1 and "unknown", and older readers skip them."""
    new_fields = {"Trajectory": {"temperature"},
                  "TrainingBatch": {"temperatures", "logprobs_recorded"}}
    for name, fields in new_fields.items():
        current = next(i for i in builtin_schemas() if i.name == f"stacx.{name}")
        older = _without(f"stacx.{name}", fields)
        assert compatibility_problems(current.schema, [older.schema], Compatibility.FULL) == [], name
    older = _without("stacx.Trajectory", new_fields["Trajectory"])
    record = Trajectory(trajectory_id="t", group_id="g", sample_index=0, task_id="k",
                        task_type="x", model_name="m", policy_version=1)
    back = Codec(resolver={older.fingerprint: older}.get).decode(
        Codec(schemas=[older]).encode(record), Trajectory)
    assert back.temperature == 1.0
    record.temperature = 0.7
    assert Codec().decode(Codec().encode(record), Trajectory).temperature == 0.7


def test_weight_content_hash_evolves_both_ways() -> None:
    """`WeightVersion.content_hash` was added with a default: announcements of older trainers read
    as "" (unknown), and older readers skip the field."""
    current = next(i for i in builtin_schemas() if i.name == "stacx.WeightVersion")
    older = _without("stacx.WeightVersion", {"content_hash"})
    assert compatibility_problems(current.schema, [older.schema], Compatibility.FULL) == []
    record = WeightVersion(model_name="policy", version=3, path="/w/3", content_hash="sha256:ab")
    back = Codec(resolver={older.fingerprint: older}.get).decode(
        Codec(schemas=[older]).encode(record), WeightVersion)
    assert back.version == 3 and back.content_hash == ""
    assert Codec().decode(Codec().encode(record), WeightVersion).content_hash == "sha256:ab"
