"""Compile an Avro schema into a Python reader that builds typed records straight from the bytes.

Used when an event was written with the local schema (no resolution needed): one generated
function per record type reads the Avro binary body and calls the record's class, skipping the
intermediate dicts of a generic reader. Packed arrays (`bytes` fields with a `dtype` attribute)
become `numpy.frombuffer` views over the event's own bytes: no copy, and read-only, because the
bytes object they view is immutable. Events that need schema resolution keep the generic path.

The generated source is plain Python (see `reader_source`), inlining the one- and two-byte
varints, which cover field counts, lengths below 8 KiB and small integers. Empty packed arrays
are one shared read-only array per dtype, and plain dataclasses get their fields stored
without a keyword call of `__init__` (see `_construct`).
"""

from __future__ import annotations
import __future__

import dataclasses
import enum
import keyword
import struct
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from schemas._convert import full_name
from schemas._native import native_factory

__all__ = ["Reader", "compile_reader", "reader_source"]

Reader = Callable[[bytes, int], tuple[Any, int]]
"""(event bytes, offset of the Avro body) -> (record, offset after it). Needs `bytes`: the
views it makes must not alias a mutable buffer."""

_INT_TYPES = {"int", "long"}
_ANNOTATIONS = __future__.annotations.compiler_flag
"""The generated source's Cython annotations (`pos: cython.Py_ssize_t`) stay unevaluated."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Zig-zag varint at `pos` (any length): (value, position after it)."""
    shift = result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at offset {pos}")


def _empty(dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The one empty array of `dtype` that every empty field shares: read-only like the views."""
    array = np.empty(0, dtype)
    array.flags.writeable = False
    return array


def _bad_size(pos: int, size: int) -> ValueError:
    return ValueError(f"a field of {size} bytes at offset {pos} does not fit the event")


class _Generator:
    """Emits the source of one reader function per record, and the globals they need."""

    def __init__(self, classes: Mapping[str, type]) -> None:
        self.classes = classes
        self.names: dict[str, Any] = {
            "_varint": _varint,
            "_frombuffer": np.frombuffer,
            "_new": object.__new__,
            "_bad_size": _bad_size,
            "_float": struct.Struct("<f").unpack_from,
            "_double": struct.Struct("<d").unpack_from,
        }
        self.functions: list[str] = []
        self.records: dict[str, str] = {}
        """Record full name -> the function reading it (top level and recursive records)."""
        self.record_schemas: dict[str, Mapping[str, Any]] = {}
        self._open: list[str] = []
        """Records whose fields are being emitted: a reference to one of them is recursive."""
        self.enums: dict[str, str] = {}
        self.fixed: dict[str, int] = {}
        self._counter = 0
        self.typed: set[str] = set()
        """Locals of the function being emitted that only ever hold C integers (see `_declare`)."""

    def fresh(self, stem: str) -> str:
        self._counter += 1
        return f"{stem}{self._counter}"

    def constant(self, stem: str, value: Any) -> str:
        name = self.fresh(f"_{stem}")
        self.names[name] = value
        return name

    # -- types -----------------------------------------------------------------------------

    def emit(
        self, avro: Any, target: str, ns: str | None, dtype: str | None, out: list[str], ind: str
    ) -> None:
        """Lines reading one value of type `avro` into the local `target`, advancing `pos`."""
        if isinstance(avro, list):
            return self._union(avro, target, ns, dtype, out, ind)
        if isinstance(avro, dict):
            kind = avro["type"]
            if kind == "record":
                fname = full_name(avro["name"], avro.get("namespace", ns))
                return self._record_value(fname, avro, target, out, ind)
            if kind == "enum":
                return self._enum_value(self.enum(avro, ns), target, out, ind)
            if kind == "array":
                return self._array(avro["items"], target, ns, out, ind)
            if kind == "map":
                return self._map(avro["values"], target, ns, out, ind)
            if kind == "fixed":
                return self._fixed(self.define_fixed(avro, ns), target, out, ind)
            return self.emit(kind, target, ns, dtype or avro.get("dtype"), out, ind)
        return self._named_or_primitive(avro, target, ns, dtype, out, ind)

    def _named_or_primitive(
        self, name: str, target: str, ns: str | None, dtype: str | None, out: list[str], ind: str
    ) -> None:
        if name == "null":
            out.append(f"{ind}{target} = None")
        elif name == "boolean":
            out += [f"{ind}{target} = buf[pos] == 1", f"{ind}pos += 1"]
        elif name in _INT_TYPES:
            self._long(target, out, ind)
        elif name == "float":
            out += [f"{ind}{target} = _float(buf, pos)[0]", f"{ind}pos += 4"]
        elif name == "double":
            out += [f"{ind}{target} = _double(buf, pos)[0]", f"{ind}pos += 8"]
        elif name == "string":
            self._sized("n", out, ind)
            out += [f"{ind}{target} = buf[pos:pos + n].decode()", f"{ind}pos += n"]
        elif name == "bytes":
            self._bytes(target, dtype, out, ind)
        else:
            self._named(full_name(name, ns), target, out, ind)

    def _named(self, fname: str, target: str, out: list[str], ind: str) -> None:
        if fname in self.record_schemas:
            self._record_value(fname, self.record_schemas[fname], target, out, ind)
        elif fname in self.enums:
            self._enum_value(self.enums[fname], target, out, ind)
        elif fname in self.fixed:
            self._fixed(self.fixed[fname], target, out, ind)
        else:
            raise ValueError(f"schema refers to {fname!r} before defining it")

    def _long(self, target: str, out: list[str], ind: str) -> None:
        """One- and two-byte varints inline (C arithmetic once compiled), longer ones by a call."""
        self.typed.add("b")
        out += [f"{ind}b = buf[pos]",
                f"{ind}if b < 128:",
                f"{ind}    {target} = (b >> 1) ^ -(b & 1)",
                f"{ind}    pos += 1",
                f"{ind}elif buf[pos + 1] < 128:",
                f"{ind}    b = (b & 127) | (buf[pos + 1] << 7)",
                f"{ind}    {target} = (b >> 1) ^ -(b & 1)",
                f"{ind}    pos += 2",
                f"{ind}else:",
                f"{ind}    {target}, pos = _varint(buf, pos)"]  # fmt: skip

    def _sized(self, target: str, out: list[str], ind: str, multiple: int = 1) -> None:
        """A length prefix, checked to be >= 0, to fit the event (and to be a multiple of the
        item size)."""
        self._long(target, out, ind)
        misfit = f" or {target} % {multiple}" if multiple > 1 else ""
        out += [f"{ind}if {target} < 0 or pos + {target} > end{misfit}:",
                f"{ind}    raise _bad_size(pos, {target})"]  # fmt: skip

    def _bytes(self, target: str, dtype: str | None, out: list[str], ind: str) -> None:
        if not dtype:
            self._sized("n", out, ind)
            out += [f"{ind}{target} = buf[pos:pos + n]", f"{ind}pos += n"]
            return
        dt = np.dtype(dtype)
        out += [f"{ind}if buf[pos] == 0:",  # empty (a common default): the shared empty array
                f"{ind}    {target} = {self.constant('empty', _empty(dt))}",
                f"{ind}    pos += 1",
                f"{ind}else:"]  # fmt: skip
        inner = ind + "    "
        self._sized("n", out, inner, dt.itemsize)
        count = "n" if dt.itemsize == 1 else f"n // {dt.itemsize}"
        view = f"_frombuffer(buf, {self.constant('dtype', dt)}, {count}, pos)"
        out += [f"{inner}{target} = {view}", f"{inner}pos += n"]

    def _fixed(self, size: int, target: str, out: list[str], ind: str) -> None:
        out += [f"{ind}if pos + {size} > end:", f"{ind}    raise _bad_size(pos, {size})",
                f"{ind}{target} = buf[pos:pos + {size}]", f"{ind}pos += {size}"]  # fmt: skip

    def _call(self, function: str, target: str, out: list[str], ind: str) -> None:
        out.append(f"{ind}{target}, pos = {function}(buf, pos)")

    def _enum_value(self, table: str, target: str, out: list[str], ind: str) -> None:
        self.typed.add("i")
        self._long("i", out, ind)
        out.append(f"{ind}{target} = {table}[i]")

    def _union(
        self, branches: list[Any], target: str, ns: str | None, dtype: str | None, out: list[str], ind: str
    ) -> None:
        index = self.fresh("u")
        self.typed.add(index)
        self._long(index, out, ind)
        for i, branch in enumerate(branches):
            out.append(f"{ind}{'if' if i == 0 else 'elif'} {index} == {i}:")
            self.emit(branch, target, ns, dtype, out, ind + "    ")
        out += [f"{ind}else:", f"{ind}    raise ValueError(f'union branch {{{index}}} out of range')"]

    def _blocks(self, out: list[str], ind: str) -> str:
        """Open the block loop of an array or map; returns the loop variable of the block count."""
        count = self.fresh("c")
        self.typed.add(count)
        out.append(f"{ind}while True:")
        self._long(count, out, ind + "    ")
        out += [
            f"{ind}    if {count} == 0:",
            f"{ind}        break",
            f"{ind}    if {count} < 0:",
            f"{ind}        {count} = -{count}",
            f"{ind}        _, pos = _varint(buf, pos)",
        ]
        return count

    def _array(self, items: Any, target: str, ns: str | None, out: list[str], ind: str) -> None:
        values, item = self.fresh("a"), self.fresh("x")
        out += [f"{ind}{values} = []", *self._unless_empty(ind)]
        inner = ind + "    "
        count = self._blocks(out, inner)
        out.append(f"{inner}    for {self._loop_variable()} in range({count}):")
        self.emit(items, item, ns, None, out, inner + "        ")
        out += [f"{inner}        {values}.append({item})", f"{ind}{target} = {values}"]

    def _map(self, values_type: Any, target: str, ns: str | None, out: list[str], ind: str) -> None:
        values, key, item = self.fresh("m"), self.fresh("k"), self.fresh("x")
        out += [f"{ind}{values} = {{}}", *self._unless_empty(ind)]
        inner = ind + "    "
        count = self._blocks(out, inner)
        out.append(f"{inner}    for {self._loop_variable()} in range({count}):")
        self.emit("string", key, ns, None, out, inner + "        ")
        self.emit(values_type, item, ns, None, out, inner + "        ")
        out += [f"{inner}        {values}[{key}] = {item}", f"{ind}{target} = {values}"]

    def _loop_variable(self) -> str:
        name = self.fresh("j")
        self.typed.add(name)
        return name

    @staticmethod
    def _unless_empty(ind: str) -> list[str]:
        """An empty array or map is one 0 byte: skip it, else open the block loop below."""
        return [f"{ind}if buf[pos] == 0:", f"{ind}    pos += 1", f"{ind}else:"]

    # -- named types -------------------------------------------------------------------------

    def record(self, avro: Mapping[str, Any], ns: str | None) -> str:
        """The function reading the record `avro` (defined in namespace `ns`)."""
        return self._function(full_name(avro["name"], avro.get("namespace", ns)), avro)

    def _function(self, fname: str, avro: Mapping[str, Any]) -> str:
        if fname in self.records:
            return self.records[fname]
        function = self.fresh("_read_" + fname.rpartition(".")[2] + "_")
        self.records[fname] = function
        body: list[str] = []
        outer, self.typed = self.typed, {"n"}
        self._fields(fname, avro, "r", body, "    ")
        source = [
            f"def {function}(buf: bytes, pos: cython.Py_ssize_t):",
            "    end: cython.Py_ssize_t = len(buf)",
            *(f"    {name}: cython.Py_ssize_t" for name in sorted(self.typed)),
            *body,
            "    return r, pos",
        ]
        self.typed = outer
        self.functions.append("\n".join(source))
        return function

    def _record_value(
        self, fname: str, avro: Mapping[str, Any], target: str, out: list[str], ind: str
    ) -> None:
        """A nested record, read inline (no call, no result tuple); a recursive one by a call."""
        if fname in self._open:
            self._call(self._function(fname, avro), target, out, ind)
        else:
            self._fields(fname, avro, target, out, ind)

    def _fields(self, fname: str, avro: Mapping[str, Any], target: str, out: list[str], ind: str) -> None:
        """Lines reading every field of the record into fresh locals, then building `target`."""
        cls = self.classes.get(fname)
        if cls is None:
            raise ValueError(
                f"no Python class for Avro record {fname!r}: pass it in `classes` (full name -> class)"
            )
        self.record_schemas[fname] = avro
        self._open.append(fname)
        inner_ns = fname.rpartition(".")[0] or None
        fields = avro["fields"]
        values = [self.fresh("f") for _ in fields]
        for f, value in zip(fields, values, strict=True):
            self.emit(f["type"], value, inner_ns, f.get("dtype"), out, ind)
        self._open.pop()
        names = [f["name"] for f in fields]
        out += _construct(cls, self.constant("cls", cls), dict(zip(names, values, strict=True)), target, ind)

    def enum(self, avro: Mapping[str, Any], ns: str | None) -> str:
        fname = full_name(avro["name"], avro.get("namespace", ns))
        if fname in self.enums:
            return self.enums[fname]
        cls: Any = self.classes.get(fname)
        symbols = avro["symbols"]
        if cls is None:
            members: tuple[Any, ...] = tuple(symbols)
        elif issubclass(cls, enum.Enum):
            by_symbol = {member.value: member for member in cls}
            members = tuple(by_symbol[s] for s in symbols)
        else:
            members = tuple(cls(s) for s in symbols)
        self.enums[fname] = self.constant("enum", members)
        return self.enums[fname]

    def define_fixed(self, avro: Mapping[str, Any], ns: str | None) -> int:
        self.fixed[full_name(avro["name"], avro.get("namespace", ns))] = int(avro["size"])
        return int(avro["size"])


def _construct(cls: type, cls_name: str, values: Mapping[str, str], target: str, ind: str) -> list[str]:
    """Lines building the record `target` from locals (`values`: schema field -> local name).

    A plain dataclass whose fields are exactly the schema's gets its attributes stored
    directly, as `copy` and `pickle` do: a keyword call of a generated `__init__` costs about
    three times as much, and with every field given that `__init__` only stores them too.
    """
    names = list(values)
    if _stores_fields_only(cls, names):
        return [f"{ind}{target} = _new({cls_name})", *(f"{ind}{target}.{n} = {v}" for n, v in values.items())]
    if all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        kwargs = ", ".join(f"{n}={v}" for n, v in values.items())
    else:  # a field named like a Python keyword
        kwargs = "**{" + ", ".join(f"{n!r}: {v}" for n, v in values.items()) + "}"
    return [f"{ind}{target} = {cls_name}({kwargs})"]


def _stores_fields_only(cls: type, names: list[str]) -> bool:
    """True when `cls(**fields)` does nothing but store each field: a dataclass with its
    generated `__init__`, not frozen, no `__post_init__`, and exactly the schema's fields."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        return False
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    init = getattr(cls.__init__, "__code__", None)
    generated = init is not None and init.co_filename.startswith("<")
    fields = dataclasses.fields(cls)
    return (
        generated
        and params.init
        and not params.frozen
        and all(f.init for f in fields)
        and sorted(f.name for f in fields) == sorted(names)
        and all(n.isidentifier() and not keyword.iskeyword(n) for n in names)
    )


def _generate(schema: Mapping[str, Any], classes: Mapping[str, type]) -> tuple[str, dict[str, Any]]:
    """The source of `_make(names)`, which binds the constants (classes, dtypes, helpers) as
    closure variables and returns the reader: readers of one source for different classes
    share the compiled module, never their bindings."""
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        raise ValueError("compile_reader needs a record schema at the top level")
    generator = _Generator(classes)
    entry = generator.record(schema, schema.get("namespace"))
    functions = "\n\n".join(textwrap.indent(f, "    ") for f in generator.functions)
    bindings = "".join(f"    {name} = names[{name!r}]\n" for name in sorted(generator.names))
    return f"def _make(names):\n{bindings}\n{functions}\n\n    return {entry}\n", generator.names


def reader_source(schema: Mapping[str, Any], classes: Mapping[str, type]) -> str:
    """The generated Python source of `compile_reader(schema, classes)` (for reading and debugging)."""
    return _generate(schema, classes)[0]


def compile_reader(schema: Mapping[str, Any], classes: Mapping[str, type], *, native: bool = False) -> Reader:
    """A reader for the Avro binary body of `schema` (the JSON as written, `dtype` attributes kept).

    `classes` maps Avro full names of records and enums to Python classes, as for the
    converters in `schemas._convert`: the reader builds the same objects they do. `native`
    compiles the generated source to C with Cython (see `schemas._native`, ~2.3x faster;
    raises `NativeBuildError` when it cannot); else Python runs the very same source.
    """
    source, names = _generate(schema, classes)
    if native:
        make = native_factory(source)
    else:
        namespace: dict[str, Any] = {}
        code = compile(
            source, f"<avro reader {schema.get('name')}>", "exec", flags=_ANNOTATIONS, dont_inherit=True
        )
        exec(code, namespace)  # noqa: S102
        make = namespace["_make"]
    reader: Reader = make(names)
    return reader
