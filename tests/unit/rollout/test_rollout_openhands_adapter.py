"""The OpenHands adapter: registered, its own Python 3.12 venv, drivers that import nothing of
ours (they run in that venv), the task's limits in the episode spec."""

from __future__ import annotations

import ast
from pathlib import Path

from stacx.rollout.blackbox.adapter import DRIVERS, build_external, is_external
from stacx.rollout.blackbox.scaffolds.openhands import OpenHands
from stacx.rollout.blackbox.venvs import _venv_dir, scaffold_home


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return {name.split(".")[0] for name in names}


def test_openhands_is_a_registered_black_box_scaffold_with_its_own_python_312_venv() -> None:
    assert is_external("openhands")
    adapter = build_external("openhands", {"llm": {"native_tool_calling": True}})
    assert isinstance(adapter, OpenHands) and adapter.python == "3.12"
    assert set(adapter.requirements) == {"openhands-sdk==1.58.2", "openhands-tools==1.58.2"}
    assert adapter.options == {"llm": {"native_tool_calling": True}}
    assert adapter.driver_path().is_file()
    assert _venv_dir(adapter).parent == scaffold_home() and _venv_dir(adapter).name.startswith("openhands-")


def test_openhands_drivers_import_only_the_sdk_the_standard_library_and_the_shared_helpers() -> None:
    import sys

    allowed = set(sys.stdlib_module_names) | {
        "openhands",
        "pydantic",
        "__future__",
        "_stacx_episode",
        "_stacx_openhands",
    }
    for name in ("openhands_agent.py", "_stacx_openhands.py"):
        imported = _imports(DRIVERS / name)
        assert imported <= allowed, f"{name} imports {sorted(imported - allowed)}"
        assert "stacx" not in imported


def test_the_driver_file_name_does_not_shadow_the_openhands_package() -> None:
    # PYTHONPATH holds the drivers' folder: a driver named openhands.py would hide the SDK.
    assert not (DRIVERS / "openhands.py").exists() and not (DRIVERS / "openhands").exists()
