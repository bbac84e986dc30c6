"""The one config loader: YAML sections validated into each component's own `Config`.

Every service section (gateway, inference, rollout, assembler, trainer, proxy, ...) is read
through `build`, in a pipeline file and in a standalone service file alike.

A component never sees the whole tree: `section(tree, "gateway", Gateway.Config, source=path)` builds
just its dataclass. Validation is pydantic's (nested dataclasses, literals, enums, optionals); every
problem becomes one line naming the file, the field and what is expected, e.g.

    trainer.yaml: optimizer.lr: expected a number, got 'fast'

`ConfigError` carries those lines (`.lines`); commands print them and exit 2, never a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import pydantic
import yaml

from stacx.schemas.plugins import did_you_mean
from stacx.schemas.topics import BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP

__all__ = [
    "ConfigError",
    "Port",
    "Probability",
    "bootstrap_servers",
    "build",
    "build_partial",
    "deep_merge",
    "file_section",
    "load_yaml",
    "resolve_path",
    "section",
]

T = TypeVar("T")

Port = Annotated[int, pydantic.Field(ge=0, le=65535)]
"""A TCP port field (0: any free one); `build` reports a value outside 0..65535 with its path.
Other ranges use pydantic's own types (`PositiveInt`, `NonNegativeFloat`, ...)."""
Probability = Annotated[float, pydantic.Field(gt=0.0, le=1.0)]
"""A share in (0, 1] (e.g. nucleus sampling's `top_p`)."""


class ConfigError(ValueError):
    """A config file or field is invalid; each line names one field and how to fix it."""

    def __init__(self, message: str | Sequence[str]) -> None:
        self.lines = [message] if isinstance(message, str) else list(message)
        super().__init__("\n".join(self.lines))


def load_yaml(path: str | Path, *, allow_empty: bool = False) -> dict[str, Any]:
    """The mapping in a YAML file; a missing, unreadable, empty or malformed file is one line."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; pass a YAML config file")
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc)}") from exc
    if data is None:
        if allow_empty:
            return {}
        raise ConfigError(f"config file {path} is empty; `stacx init` writes a commented starter config")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections, got {type(data).__name__}")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: line:column and the parser's problem (PyYAML's own message spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def bootstrap_servers(tree: Mapping[str, Any]) -> str:
    """`bootstrap_servers` of the config, else $STACX_KAFKA, else the local broker."""
    value = tree.get("bootstrap_servers") or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP
    return str(value)


def resolve_path(value: str, base: Path) -> Path:
    """A path from a config file: absolute as is; relative to the working directory when it exists
    there, else relative to the config file's directory `base`."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    return (base / path).resolve()


def deep_merge(base: Any, over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` (a mapping, or anything else: replaced) with `over` laid on top, mapping by mapping
    (command-line field flags over a file's section)."""
    merged = dict(base) if isinstance(base, Mapping) else {}
    for key, value in over.items():
        merged[key] = deep_merge(merged.get(key), value) if isinstance(value, Mapping) else value
    return merged


def file_section(tree: Mapping[str, Any], name: str, cls: type[Any], source: str) -> tuple[Any, str]:
    """(the data of service `name`, where it is) in a config file, one rule for every command:
    a file with a `name:` mapping that is no field of `cls` (a pipeline or stack file) gives that
    section (`file: name`); any other file is the section itself (`file`)."""
    data = tree.get(name)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if isinstance(data, Mapping) and name not in fields:
        return data, f"{source}: {name}"
    return tree, source


def section(tree: Mapping[str, Any], name: str, cls: type[T], source: str = "config") -> T:
    """Build `cls` (a dataclass) from `tree[name]` (missing section: all defaults)."""
    data = tree.get(name) or {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: section `{name}` must be a mapping, got {type(data).__name__}")
    return build(cls, data, where=f"{source}: {name}")


def build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Validate `data` into the dataclass `cls`; every problem is one line starting with `where`
    (`file: section` gives `file: section.field: ...`; a bare `file` gives `file: field: ...`)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    try:
        root: Any = _root(cls)  # type: ignore[arg-type]  # a class is hashable: built once per class
        value: T = root.model_validate({"value": dict(data)}).value
    except pydantic.ValidationError as exc:
        raise ConfigError(
            [_line(cls, {**err, "loc": err["loc"][1:]}, where) for err in exc.errors()]
        ) from exc
    except (TypeError, ValueError) as exc:  # a library config's own check (__post_init__)
        raise ConfigError(f"{where}: {exc}") from exc
    except Exception as exc:
        if type(exc).__name__.endswith("ConfigError"):  # e.g. stacx.trainer.errors.ConfigError
            raise ConfigError(f"{where}: {exc}") from exc
        raise
    return value


def build_partial(cls: type[T], data: Mapping[str, Any], where: str) -> tuple[T | None, list[str]]:
    """`build`, and when it fails, `cls` built again with each invalid field left at its default:
    (that value, every problem line). The value lets the checks of what a section names (its
    recipe, reward, scaffold) run beside its type errors, so one pass reports both; it is None
    when a whole-object check (`__post_init__`) or a required field stands in the way."""
    try:
        return build(cls, data, where), []
    except ConfigError as exc:
        lines = list(exc.lines)
    current: Any = _deep_copy(data)
    for _ in range(4):  # each round drops the fields the last one refused; nesting is shallow
        try:
            root: Any = _root(cls)  # type: ignore[arg-type]
            return root.model_validate({"value": current}).value, lines
        except pydantic.ValidationError as exc:
            errors = exc.errors()
        except (TypeError, ValueError):
            return None, lines
        if not all(err["type"] != "value_error" and _drop(current, err["loc"][1:]) for err in errors):
            return None, lines
    return None, lines


def _deep_copy(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def _drop(tree: Any, loc: Sequence[Any]) -> bool:
    """Remove the mapping entry at `loc` (the field falls back to its default); False when
    `loc` does not end at a mapping entry."""
    for part in loc[:-1]:
        tree = tree.get(part) if isinstance(tree, Mapping) else None
    if not loc or not isinstance(tree, dict) or loc[-1] not in tree:
        return False
    del tree[loc[-1]]
    return True


@functools.cache
def _root(cls: Any) -> type[pydantic.BaseModel]:
    """A model with one field of type `cls`: its `extra="forbid"` reaches every nested dataclass
    (a bare TypeAdapter of a stdlib dataclass ignores unknown fields)."""
    return pydantic.create_model(  # type: ignore[call-overload,no-any-return]
        f"{cls.__name__}File", __config__=pydantic.ConfigDict(extra="forbid"), value=(cls, ...)
    )


def _line(cls: type[Any], err: Any, where: str) -> str:
    loc = [str(part) for part in err["loc"]]
    field = ".".join(loc)
    joint = "." if ": " in where else ": "  # `file: section` + `.field`; `file` + `: field`
    prefix = f"{where}{joint}{field}" if field else where
    kind = err["type"]
    if kind == "unexpected_keyword_argument":
        valid = _fields_at(cls, loc[:-1])
        return f"{prefix}: unknown field; valid fields: {', '.join(valid)}{did_you_mean(loc[-1], valid)}"
    if kind in ("missing", "missing_argument", "missing_keyword_only_argument"):
        return f"{prefix}: required field is missing"
    message = str(err["msg"])
    if kind == "value_error":
        return f"{prefix}: {message.removeprefix('Value error, ')}"
    message = message.replace("Input should be", "expected").split(", unable to parse")[0]
    if kind in ("dataclass_type", "dict_type", "model_type", "dataclass_args_type"):
        message = "expected a mapping of fields"
    return f"{prefix}: {message}, got {_shown(err.get('input'))}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_at(cls: Any, loc: list[str]) -> list[str]:
    """Field names of the dataclass reached from `cls` along `loc` (dict keys skipped)."""
    current: Any = cls
    for part in loc:
        current = _step(current, part)
        if current is None:
            return []
    current = _unwrap(current)
    if dataclasses.is_dataclass(current):
        return sorted(f.name for f in dataclasses.fields(current) if f.init)
    return []


def _step(tp: Any, part: str) -> Any:
    tp = _unwrap(tp)
    if dataclasses.is_dataclass(tp):
        return typing.get_type_hints(tp).get(part)
    if typing.get_origin(tp) is dict:
        return typing.get_args(tp)[1]
    return None


def _unwrap(tp: Any) -> Any:
    """`X | None` -> X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp
