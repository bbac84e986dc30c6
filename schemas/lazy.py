"""Lazy public names of a package (PEP 562): a package lists where each of its names lives, and a
name's module is imported on first use, so importing the package (or one light submodule of it)
does not import its heavy ones (torch, transformers)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `package`: `homes` maps each public name to the module
    that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__
