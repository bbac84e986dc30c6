"""Dependencies point one way (ARCHITECTURE.md, "Layout"): checked on every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
OURS = {"schemas", "producers", "consumers", "rollout", "sandbox", "trainer", "infra"}
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "producers": {"schemas"},
    "consumers": {"schemas", "producers"},
    "sandbox": {"schemas"},
    # rollout reads stacx.tasks and stacx.weights through consumers/ (still acyclic; see docs/architecture.md)
    "rollout": {"schemas", "producers", "consumers", "sandbox"},
    "trainer": {"schemas", "producers", "consumers"},
    "infra": OURS,
}


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
    return modules


def _imported_packages(path: Path) -> set[str]:
    """Our subpackages a module imports (`stacx.<package>...`)."""
    parts = (module.split(".") for module in _imported_modules(path))
    return {p[1] for p in parts if len(p) > 1 and p[0] == "stacx"} & OURS


def _product_files() -> list[Path]:
    folders = [*sorted(OURS), "stacx", "tests", "bench", "examples"]
    return [path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]


def test_everything_imports_ours_through_the_stacx_namespace() -> None:
    """A user's own `trainer/` or `schemas/` never shadows ours: no module imports a bare root."""
    violations = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _product_files()
        for module in _imported_modules(path)
        if module.split(".")[0] in OURS
    ]
    assert not violations, "import our code as stacx.<package>:\n" + "\n".join(violations)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package: str) -> None:
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for imported in sorted(_imported_packages(path) - ALLOWED[package] - {package}):
            violations.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not violations, f"{package}/ may import only {sorted(ALLOWED[package])}:\n" + "\n".join(violations)


def test_sandbox_is_reached_from_rollout_through_its_client_only() -> None:
    violations = []
    for path in sorted((ROOT / "rollout").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stacx.sandbox"):
                if node.module not in {
                    "stacx.sandbox",
                    "stacx.sandbox.client",
                    "stacx.sandbox.protocols",
                    "stacx.sandbox.models",
                    "stacx.sandbox.errors",
                }:
                    violations.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert not violations, "rollout/ uses the sandbox gateway client only:\n" + "\n".join(violations)
