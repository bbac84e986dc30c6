"""Config files for `stacx` commands: YAML sections mapped onto each component's own `Config`.

A component never sees the whole tree: `section(tree, "gateway", Gateway.Config, source=path)` builds
just its dataclass, and an unknown or mistyped field is an error naming the file, the field and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from schemas.topics import BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or field is invalid; the message names it and says how to fix it."""


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections, got {type(data).__name__}")
    return data


def bootstrap_servers(tree: Mapping[str, Any]) -> str:
    """`bootstrap_servers` of the config, else $STACX_KAFKA, else the local broker."""
    value = tree.get("bootstrap_servers") or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP
    return str(value)


def section(tree: Mapping[str, Any], name: str, cls: type[T], source: str = "config") -> T:
    """Build `cls` (a dataclass) from `tree[name]` (missing section: all defaults)."""
    data = tree.get(name) or {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: section `{name}` must be a mapping, got {type(data).__name__}")
    return build(cls, data, where=f"{source}: {name}")


def build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {key: _coerce(value, hints[key], f"{where}.{key}") for key, value in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return build(hint, value, where)  # type: ignore[arg-type]
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ConfigError(f"{where} must be {hint.__name__}, got {value!r}")
    if hint is int and isinstance(value, bool):
        raise ConfigError(f"{where} must be int, got {value!r}")
    if origin in (tuple, list) and isinstance(value, list):
        return origin(value)
    return value
