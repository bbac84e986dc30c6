"""Command-line flags generated from a config class: one `--a.b.c VALUE` flag per field of its
tree (nested dataclasses walked), named by the field path the YAML file uses, its help the
field's docstring. A command adds them with `add_config_flags` and lays the given ones over its
file's section with `config_overrides`; the one config loader then validates both alike, so a
bad flag is a line naming its field path, as a bad file value is. Values are YAML
(`--grouping.group_size 8`, `--filtering.ok_statuses '[COMPLETED, TRUNCATED]'`); a string field
takes the text as written.

Registering is lazy (`lazy_config_flags`): a command names its config class by dotted path, and
only the command being run imports it, so `stacx` starts as fast as before.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any

import yaml

from stacx.schemas.config import deep_merge

__all__ = ["add_config_flags", "config_overrides", "deep_merge", "lazy_config_flags", "resolve_lazy_flags"]

_DEST = "config_field:"
"""Prefix of the argparse dest of a generated flag (never clashes with a hand-written one)."""
_LAZY = "_stacx_config_flags"


def lazy_config_flags(parser: argparse.ArgumentParser, config_class: str) -> None:
    """Let `parser` get the flags of `config_class` (`package.module:Class.Nested`) when its
    command runs (`resolve_lazy_flags`)."""
    setattr(parser, _LAZY, config_class)


def resolve_lazy_flags(parser: argparse.ArgumentParser) -> None:
    """Add the generated flags to `parser` if it asked for them and has not got them yet."""
    ref = getattr(parser, _LAZY, None)
    if ref is None:
        return
    from stacx.schemas.plugins import import_object

    delattr(parser, _LAZY)
    add_config_flags(parser, import_object(ref))


def add_config_flags(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """One flag per field of `cls`'s tree, in a group of its own."""
    group = parser.add_argument_group(
        "config fields", "each sets the field of that path over the file's section (a YAML value)"
    )
    for path, hint, doc in _leaves(cls, ""):
        group.add_argument(
            f"--{path}", dest=f"{_DEST}{path}", default=argparse.SUPPRESS, metavar=_metavar(hint),
            type=str if _is_text(hint) else _yaml_value, help=doc.replace("%", "%%"),
        )


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The generated flags given on the command line, as the nested mapping a file would hold."""
    tree: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if not dest.startswith(_DEST):
            continue
        *parents, leaf = dest.removeprefix(_DEST).split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _leaves(cls: type, prefix: str) -> Iterator[tuple[str, Any, str]]:
    hints = _hints(cls)
    docs = _field_docs(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = _unwrap(hints.get(f.name, Any))
        path = f"{prefix}{f.name}"
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            yield from _leaves(hint, f"{path}.")
        else:
            yield path, hint, docs.get(f.name, "")


def _hints(cls: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation only a type checker resolves: such fields take YAML
        return {}


def _unwrap(hint: Any) -> Any:
    """`X | None` -> X; `Annotated[X, ...]` -> X."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return _unwrap(args[0])
    return hint


def _is_text(hint: Any) -> bool:
    return hint is str


def _metavar(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # not YAML: the loader says what the field expects


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """Field name -> the first sentence of the docstring under it in the class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    if not isinstance(body, ast.ClassDef):
        return {}
    docs = {}
    for field_node, doc_node in zip(body.body, body.body[1:], strict=False):
        if (isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name)
                and isinstance(doc_node, ast.Expr) and isinstance(doc_node.value, ast.Constant)
                and isinstance(doc_node.value.value, str)):
            text = " ".join(doc_node.value.value.split())
            docs[field_node.target.id] = text.split(". ")[0].rstrip(".")
    return docs
