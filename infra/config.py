"""Config files for `stacx` commands: the product's one loader (`stacx.schemas.config`), plus the
command-line layer every service command shares: its section from `--config FILE` with the
flags given on top (`section_with_overrides`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from stacx.schemas.config import ConfigError, bootstrap_servers, build, load_yaml, resolve_path, section

__all__ = [
    "EXPLAIN_HELP",
    "ConfigError",
    "bootstrap_servers",
    "build",
    "explained",
    "load_yaml",
    "resolve_path",
    "section",
    "section_with_overrides",
]

T = TypeVar("T")

EXPLAIN_HELP = "validate the config, print it resolved (defaults included) as YAML; start nothing"
"""What `--explain` does, on every command that takes a config."""


def explained(config: Any) -> str:
    """A validated config (a dataclass or pydantic model) as YAML, every default written out."""
    import pydantic
    import yaml

    data = pydantic.TypeAdapter(type(config)).dump_python(config, mode="json")
    return yaml.safe_dump(data, sort_keys=False, width=110)


def section_with_overrides(
    args: argparse.Namespace,
    name: str,
    cls: type[T],
    flags: Mapping[str, str],
    *,
    defaults: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
) -> T:
    """`cls` from the `name:` section of `args.config` (absent: all defaults), with every flag of
    `flags` (argparse dest -> dotted field path, e.g. `"threads": "server.torch_threads"`) that
    was given on the command line set on top; `defaults(tree)` (dotted path -> value, from the
    whole file) fill the fields neither sets."""
    tree = load_yaml(args.config) if getattr(args, "config", None) else {}
    data = tree.get(name) or {}
    source = args.config or "command line"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: section `{name}` must be a mapping, got {type(data).__name__}")
    merged: dict[str, Any] = _deep_copy(data)
    for path, value in (defaults(tree) if defaults else {}).items():
        _set_default(merged, path.split("."), value)
    for dest, path in flags.items():
        value = getattr(args, dest, None)
        if value is not None:
            _set(merged, path.split("."), value)
    return build(cls, merged, where=f"{source}: {name}")


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _set(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = tree.get(part)
        if not isinstance(child, dict):
            child = tree[part] = {}
        tree = child
    tree[path[-1]] = value


def _set_default(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = tree.get(part)
        if child is None:
            child = tree[part] = {}
        if not isinstance(child, dict):
            return  # a wrong type the user wrote: `build` reports it
        tree = child
    tree.setdefault(path[-1], value)
