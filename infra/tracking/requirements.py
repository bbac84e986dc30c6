"""The packages a shipped tracker writes with, and the one line a missing one gets."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from stacx.infra.tracking.errors import MissingTrackerPackage

__all__ = ["Requirement"]


@dataclass(frozen=True, slots=True)
class Requirement:
    """The modules a tracker imports and the `stacx[extra]` that installs them."""

    tracker: str
    """The tracker's registered name."""
    modules: tuple[str, ...]
    """Top-level modules it needs; the first is the library it writes with."""
    extra: str
    """Optional-dependency group of stacx that installs them."""

    def missing(self) -> str | None:
        """The one-line fix when a module is not installed (nothing is imported), else None."""
        absent = [m for m in self.modules if importlib.util.find_spec(m) is None]
        return self._message(absent[0]) if absent else None

    def load(self) -> ModuleType:
        """The first module, imported; `MissingTrackerPackage` when any of them is absent."""
        problem = self.missing()
        if problem:
            raise MissingTrackerPackage(problem)
        return importlib.import_module(self.modules[0])

    def _message(self, module: str) -> str:
        return f"the {self.tracker} tracker needs the {module!r} package: pip install 'stacx[{self.extra}]'"
