"""The quickstart's plug-in (examples/quickstart/arithmetic.py), imported as the quickstart's
config names it: `quickstart.arithmetic` with `examples/` on the plug-in path."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOURCE = "quickstart.arithmetic:ArithmeticTasks"
"""`pipeline.tasks.source` of examples/quickstart.yaml."""


def tasks_section(**options: Any) -> dict[str, Any]:
    """A `pipeline.tasks` section naming the quickstart's task source."""
    return {"source": SOURCE, "options": options} if options else {"source": SOURCE}


def arithmetic() -> ModuleType:
    """The plug-in module, imported through the plug-in path as every service imports it."""
    from stacx.infra.pipeline.config import use_plugin_paths

    use_plugin_paths([EXAMPLES])
    return importlib.import_module("quickstart.arithmetic")
