"""Benchmark suites by name (`stacx bench SUITE`): the shipped adapters, any registered one, a
dotted path `package.module:Suite`, or an entry point in the group `stacx.benchmarks`.

A suite factory is called with no arguments and returns a `BenchmarkSuite`. The shipped adapters
register themselves here exactly as a user's would: `@BENCHMARKS.register("name")`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from stacx.infra.benchmarks.protocols import BenchmarkSuite
from stacx.schemas.plugins import PluginError, Registry

__all__ = ["BENCHMARKS", "BUILTIN_MODULES", "build_suite"]

BUILTIN_MODULES = (
    "stacx.infra.benchmarks.harbor_suites",
    "stacx.infra.benchmarks.swebench",
    "stacx.infra.benchmarks.kernelbench",
    "stacx.infra.benchmarks.algotune",
    "stacx.infra.benchmarks.math_suites",
)
"""The shipped adapters: each module registers its suites on import."""

_ATTRIBUTES = ("name", "metric", "layout", "task_type", "scaffold", "reward")
_METHODS = ("prepare", "load", "score")


def _check(factory: Any) -> str | None:
    if not callable(factory):
        return f"is a {type(factory).__name__}, not a suite class or factory"
    if isinstance(factory, type):
        missing = [m for m in _METHODS if not callable(getattr(factory, m, None))]
        if missing:
            suite = "stacx.infra.benchmarks.BenchmarkSuite"
            return f"class {factory.__name__} lacks {', '.join(missing)} ({suite})"
    return None


def _load_builtin() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


BENCHMARKS: Registry[Callable[[], BenchmarkSuite]] = Registry(
    "benchmarks", what="benchmark suite", check=_check, load_builtin=_load_builtin
)
"""Suite factories (classes) by name; each is called with no arguments."""


def build_suite(ref: str) -> BenchmarkSuite:
    """The suite `ref` names; `PluginError` (one line) when it does not resolve or lacks a part."""
    suite = BENCHMARKS.build(ref)
    missing = [a for a in _ATTRIBUTES if not isinstance(getattr(suite, a, None), str)]
    missing += [m for m in _METHODS if not callable(getattr(suite, m, None))]
    if missing:
        raise PluginError(
            f"{ref!r}: the suite it built lacks {', '.join(missing)} "
                    "(stacx.infra.benchmarks.BenchmarkSuite)",
            kind="signature",
        )
    return suite
