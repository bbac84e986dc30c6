"""Plug-ins by name: how a config names user code at every extension point.

A config field that takes a plug-in (`reward:`, `scaffold:`, `recipe:`, `strategy:`, ...) accepts

- a registered name (`exact_answer`): shipped ones, and whatever code already imported registered;
- a dotted path `package.module:object` (`mypkg.rewards:score`), imported on first use, in the
  process that needs it (a service spawned by `stacx run` imports it itself), or a file
  `path/to/rewards.py:score`;
- a name that an installed distribution declares in the entry-point group `stacx.<point>`
  (`[project.entry-points."stacx.rewards"] score = "mypkg.rewards:score"`), so a pip-installed
  package adds names without touching a config.

Every point is a `Registry` with a check of the object's shape (its protocol, its call signature).
Every failure is one `PluginError` line naming the reference and the cause: unknown name, module not
found, no such attribute, raised on import (with the exception's first line), wrong signature.
Callers prefix the config field, e.g.

    trainer.yaml: rollout.manager.evaluators.default.reward: 'mypkg.rewards:score': module 'mypkg'
    not found (put its folder on PYTHONPATH or install it)

Lives in `schemas/` because every package (rollout, trainer, sandbox, consumers) owns a registry
and may import nothing of ours but `schemas`.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = [
    "PluginError",
    "PluginInfo",
    "Registry",
    "accepts",
    "did_you_mean",
    "first_line",
    "import_object",
    "registries",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

ENTRY_POINT_PREFIX = "stacx."
"""Entry-point groups are `stacx.<point>` (`stacx.rewards`, `stacx.scaffolds`, ...)."""


class PluginError(ValueError):
    """A plug-in reference does not resolve; the message is one line without the field path."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
        """unknown | module | attribute | import | signature"""


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One available plug-in of a point, for `stacx plugins`."""

    name: str
    """The name a config uses."""
    origin: str
    """Where it comes from: `builtin (module)`, `registered (module)`, `entry point (dist)`."""
    summary: str = ""
    """First line of its docstring."""
    problem: str = ""
    """Why a config naming it fails or gets something else (a broken or shadowed entry point)."""


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message` of an exception."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def did_you_mean(name: object, choices: list[str]) -> str:
    """`; did you mean 'x'?` for the closest of `choices` to a mistyped `name`, else ``."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def import_object(path: str) -> Any:
    """The object at `package.module:attr.attr` or `path/to/file.py:attr` (a file that is no
    package's module, verl's `custom_reward_function.path`); every failure is one `PluginError` line."""
    module_name, _, attr_path = path.rpartition(":") if ".py:" in path else path.partition(":")
    if not module_name or not attr_path:
        raise PluginError(f"{path!r}: write a dotted path as package.module:object", kind="unknown")
    try:
        module = _load_file(path, module_name) if module_name.endswith(".py") else (
            importlib.import_module(module_name))
    except PluginError:
        raise
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise PluginError(
                f"{path!r}: module {missing!r} not found (put its folder on PYTHONPATH or install it)",
                kind="module",
            ) from exc
        raise _raised_on_import(path, module_name, exc) from exc
    except Exception as exc:  # user code at import time may raise anything
        raise _raised_on_import(path, module_name, exc) from exc
    value: Any = module
    for part in attr_path.split("."):
        if not hasattr(value, part):
            raise PluginError(
                f"{path!r}: {module_name if value is module else getattr(value, '__name__', '?')!r} has "
                f"no attribute {part!r}",
                kind="attribute",
            )
        value = getattr(value, part)
    return value


def _load_file(path: str, file: str) -> Any:
    """The module of a Python file, imported once under a name derived from its path."""
    location = Path(file).expanduser().resolve()
    if not location.is_file():
        raise PluginError(f"{path!r}: file {str(location)!r} not found", kind="module")
    name = f"stacx_file_{hashlib.sha1(str(location).encode()).hexdigest()[:12]}_{location.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, location)
    if spec is None or spec.loader is None:
        raise PluginError(f"{path!r}: {str(location)!r} is not a Python module", kind="module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by its name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _raised_on_import(path: str, module_name: str, exc: BaseException) -> PluginError:
    return PluginError(f"{path!r}: importing {module_name!r} raised {first_line(exc)}", kind="import")


def accepts(fn: Any, *args: Any, **kwargs: Any) -> str | None:
    """None when `fn` can be called with these arguments; else what is wrong with its signature."""
    if not callable(fn):
        return f"is a {type(fn).__name__}, not a callable"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"cannot be called as {_call_shape(args, kwargs)} ({exc}); its signature is {signature}"
    return None


def _call_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    names = [type(a).__name__ for a in args] + [f"{k}=..." for k in kwargs]
    return f"f({', '.join(names)})"


_REGISTRIES: dict[str, Registry[Any]] = {}


def registries() -> dict[str, Registry[Any]]:
    """Every extension point created so far, by point name."""
    return dict(_REGISTRIES)


class Registry(Generic[T]):
    """The plug-ins of one extension point: registered names, dotted paths, entry points."""

    def __init__(
        self,
        point: str,
        *,
        what: str,
        check: Callable[[Any], str | None] | None = None,
        load_builtin: Callable[[], None] | None = None,
    ) -> None:
        self.point = point
        """Point name; the entry-point group is `stacx.<point>`."""
        self.what = what
        """What one plug-in is, for messages (`reward function`, `scaffold`)."""
        self._check = check
        self._load_builtin = load_builtin
        self._entries: dict[str, tuple[T, str]] = {}
        _REGISTRIES[point] = self

    @property
    def group(self) -> str:
        return ENTRY_POINT_PREFIX + self.point

    def register(self, name: str, *, origin: str | None = None) -> Callable[[T], T]:
        """Decorator: make `obj` available to configs as `name`."""

        def add(obj: T) -> T:
            self.add(name, obj, origin=origin)
            return obj

        return add

    def add(self, name: str, obj: T, *, origin: str | None = None) -> None:
        """Register `obj` as `name` (a later registration of the same name replaces it)."""
        self._entries[name] = (obj, origin or f"registered ({getattr(obj, '__module__', '?')})")

    def is_registered(self, name: str) -> bool:
        """True when `name` was registered in this process (not counting entry points)."""
        return name in self._entries

    def names(self) -> list[str]:
        """Registered and entry-point names."""
        self._builtin()
        return sorted({*self._entries, *(ep.name for ep in self._entry_points())})

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, str) and ref in self.names()

    def resolve(self, ref: str) -> T:
        """The object `ref` names, checked against the point's shape; `PluginError` otherwise."""
        obj = self._find(ref)
        problem = self._check(obj) if self._check is not None else None
        if problem:
            raise PluginError(f"{ref!r}: wrong signature for a {self.what}: {problem}", kind="signature")
        return obj

    def build(self, ref: str, *args: Any, options_field: str = "options", **options: Any) -> Any:
        """`resolve(ref)` called with `args` and keyword `options`; `PluginError` when the options
        do not fit its signature or the call raises (user code: one line, never a traceback)."""
        factory: Any = self.resolve(ref)
        problem = accepts(factory, *args, **options)
        if problem:
            raise PluginError(f"{ref!r}: {options_field} do not fit: {problem}", kind="signature")
        try:
            return factory(*args, **options)
        except Exception as exc:
            raise PluginError(
                f"{ref!r}: building the {self.what} raised {first_line(exc)}",
                kind="import",
            ) from exc

    def _find(self, ref: str) -> T:
        if not isinstance(ref, str) or not ref:
            raise PluginError(f"{ref!r}: name a {self.what} by name or package.module:object", kind="unknown")
        if ":" in ref:
            return import_object(ref)  # type: ignore[no-any-return]
        self._builtin()
        if ref in self._entries:
            self._warn_shadowed(ref)
            return self._entries[ref][0]
        for ep in self._entry_points():
            if ep.name == ref:
                return self._load_entry_point(ep)
        names = self.names()
        raise PluginError(
            f"{ref!r} is not a known {self.what}; use one of {names} or a dotted path "
            f"package.module:object (`stacx plugins` lists them){did_you_mean(ref, names)}",
            kind="unknown",
        )

    def _warn_shadowed(self, name: str) -> None:
        for ep in self._entry_points():
            if ep.name == name:
                winner = self._entries[name][1]
                log.warning("%s %r: the entry point %s (%s) is ignored: the %s of that name wins; "
                            "rename the entry point", self.what, name, self.group, ep.value, winner)

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint) -> T:
        if ":" in ep.value:
            return import_object(ep.value)  # type: ignore[no-any-return]
        try:
            return ep.load()  # type: ignore[no-any-return]
        except Exception as exc:
            message = f"entry point {ep.name!r} ({ep.value}) raised {first_line(exc)}"
            raise PluginError(message, kind="import") from exc

    def _entry_points(self) -> Iterator[importlib.metadata.EntryPoint]:
        yield from importlib.metadata.entry_points(group=self.group)

    def _builtin(self) -> None:
        if self._load_builtin is not None:
            load, self._load_builtin = self._load_builtin, None
            load()

    def available(self) -> list[PluginInfo]:
        """Every name this point knows, with where it comes from."""
        self._builtin()
        infos = [PluginInfo(name, origin, _summary(obj)) for name, (obj, origin) in self._entries.items()]
        infos += [self._entry_point_info(ep) for ep in self._entry_points()]
        return sorted(infos, key=lambda info: info.name)

    def _entry_point_info(self, ep: importlib.metadata.EntryPoint) -> PluginInfo:
        """An entry point as `stacx plugins` shows it: loaded and checked, so a broken one says why."""
        dist = ep.dist.name if ep.dist is not None else "?"
        origin = f"entry point {self.group} of {dist} ({ep.value})"
        if ep.name in self._entries:
            winner = self._entries[ep.name][1]
            return PluginInfo(ep.name, origin, problem=f"shadowed by the {winner} of that name, which "
                              "configs get; rename the entry point")
        try:
            obj = self._load_entry_point(ep)
            problem = self._check(obj) if self._check is not None else None
        except PluginError as exc:
            return PluginInfo(ep.name, origin, problem=f"broken: {exc}")
        if problem:
            problem = f"broken: wrong signature for a {self.what}: {problem}"
            return PluginInfo(ep.name, origin, problem=problem)
        return PluginInfo(ep.name, origin, _summary(obj))


def _summary(obj: Any) -> str:
    doc = (inspect.getdoc(obj) or "").strip()
    line = doc.splitlines()[0] if doc else ""
    name = getattr(obj, "__name__", "")
    return "" if name and line.startswith(f"{name}(") else line  # a dataclass's generated signature
