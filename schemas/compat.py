"""Avro schema-resolution compatibility (Avro spec, "Schema Resolution").

`reader_problems(reader, writer)` lists why data written with `writer` cannot be read with
`reader` (empty: compatible). `check_compatibility` applies a mode against every registered
version, like a transitive schema-registry check.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

from stacx.schemas._convert import full_name
from stacx.schemas.errors import IncompatibleSchemaError

__all__ = ["Compatibility", "check_compatibility", "compatibility_problems", "reader_problems"]

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "double": {"double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class Compatibility(enum.StrEnum):
    """Which direction must resolve against every registered version."""

    BACKWARD = "BACKWARD"
    """New readers read data written with every older version (the Confluent default)."""
    FORWARD = "FORWARD"
    """Old readers read data written with the new version."""
    FULL = "FULL"
    """Both."""


def check_compatibility(
    new: Mapping[str, Any],
    registered: Iterable[Mapping[str, Any]],
    mode: Compatibility = Compatibility.FULL,
) -> None:
    """Raise IncompatibleSchemaError when `new` breaks `mode` against any registered version."""
    problems = compatibility_problems(new, registered, mode)
    if problems:
        raise IncompatibleSchemaError(full_name(new["name"], new.get("namespace")), problems)


def compatibility_problems(
    new: Mapping[str, Any],
    registered: Iterable[Mapping[str, Any]],
    mode: Compatibility = Compatibility.FULL,
) -> list[str]:
    """Every incompatibility of `new` against the registered versions under `mode`."""
    problems: list[str] = []
    for index, old in enumerate(registered):
        if mode in (Compatibility.BACKWARD, Compatibility.FULL):
            problems += [f"reading version {index}: {p}" for p in reader_problems(new, old)]
        if mode in (Compatibility.FORWARD, Compatibility.FULL):
            problems += [f"version {index} reading new: {p}" for p in reader_problems(old, new)]
    return problems


def reader_problems(reader: Any, writer: Any) -> list[str]:
    """Why `reader` cannot resolve data written with `writer`; empty when it can."""
    return _Resolver().problems(reader, writer, None, None, "")


class _Resolver:
    def __init__(self) -> None:
        self.reader_names: dict[str, Any] = {}
        self.writer_names: dict[str, Any] = {}
        self.seen: set[tuple[str, str]] = set()

    def problems(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> list[str]:
        reader, r_ns = self._deref(reader, r_ns, self.reader_names)
        writer, w_ns = self._deref(writer, w_ns, self.writer_names)
        if isinstance(writer, list):
            return [p for branch in writer for p in self.problems(reader, branch, r_ns, w_ns, path)]
        if isinstance(reader, list):
            for branch in reader:
                if not self.problems(branch, writer, r_ns, w_ns, path):
                    return []
            return [f"{path or '<root>'}: writer type {_kind(writer)} matches no branch of the reader union"]
        r_kind, w_kind = _kind(reader), _kind(writer)
        if r_kind in _PRIMITIVES or w_kind in _PRIMITIVES:
            if r_kind in _PROMOTIONS.get(w_kind, {w_kind}):
                return []
            return [f"{path or '<root>'}: writer {w_kind} cannot be read as {r_kind}"]
        if r_kind != w_kind:
            return [f"{path or '<root>'}: writer {w_kind} cannot be read as {r_kind}"]
        return getattr(self, f"_{r_kind}")(reader, writer, r_ns, w_ns, path)

    def _deref(self, schema: Any, ns: str | None, names: dict[str, Any]) -> tuple[Any, str | None]:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            fname = full_name(schema, ns)
            if fname not in names:
                raise ValueError(f"undefined named type {fname!r}")
            schema = names[fname]
        if isinstance(schema, dict) and schema.get("type") in _PRIMITIVES and len(schema) == 1:
            return schema["type"], ns
        if isinstance(schema, dict) and "name" in schema:
            fname = full_name(schema["name"], schema.get("namespace", ns))
            names.setdefault(fname, schema)
            ns = fname.rpartition(".")[0] or None
        return schema, ns

    def _record(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> list[str]:
        problems = self._names_match(reader, writer, r_ns, w_ns, path)
        key = (full_name(reader["name"], r_ns), full_name(writer["name"], w_ns))
        if problems or key in self.seen:  # recursive types: assume compatible on re-entry
            return problems
        self.seen.add(key)
        by_name = {f["name"]: f for f in writer["fields"]}
        for field in reader["fields"]:
            match = next(
                (by_name[n] for n in (field["name"], *field.get("aliases", ())) if n in by_name), None
            )
            where = f"{path}.{field['name']}" if path else field["name"]
            if match is not None:
                problems += self.problems(field["type"], match["type"], r_ns, w_ns, where)
            elif "default" not in field:
                problems.append(f"{where}: reader field is missing from the writer and has no default")
            else:
                self._define(field["type"], r_ns)
        return problems

    def _define(self, schema: Any, ns: str | None) -> None:
        """Register named types declared inside a reader field the writer lacks."""
        self._deref(schema, ns, self.reader_names)

    def _enum(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> list[str]:
        problems = self._names_match(reader, writer, r_ns, w_ns, path)
        missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
        if missing and "default" not in reader:
            problems.append(f"{path or '<root>'}: enum symbols {missing} unknown to the reader (no default)")
        return problems

    def _fixed(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> list[str]:
        problems = self._names_match(reader, writer, r_ns, w_ns, path)
        if reader["size"] != writer["size"]:
            problems.append(f"{path}: fixed size {writer['size']} cannot be read as {reader['size']}")
        return problems

    def _array(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> list[str]:
        return self.problems(reader["items"], writer["items"], r_ns, w_ns, f"{path}[]")

    def _map(self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str) -> list[str]:
        return self.problems(reader["values"], writer["values"], r_ns, w_ns, f"{path}{{}}")

    def _names_match(
        self, reader: Any, writer: Any, r_ns: str | None, w_ns: str | None, path: str
    ) -> list[str]:
        r_name = full_name(reader["name"], r_ns)
        w_name = full_name(writer["name"], w_ns)
        aliases = {full_name(a, r_ns) for a in reader.get("aliases", ())}
        if w_name.rpartition(".")[2] == r_name.rpartition(".")[2] or w_name in aliases | {r_name}:
            return []
        return [f"{path or '<root>'}: writer type {w_name} is not {r_name} (nor one of its aliases)"]


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return str(schema["type"])
