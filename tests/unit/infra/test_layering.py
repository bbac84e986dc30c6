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


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & OURS


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
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sandbox"):
                if node.module not in {
                    "sandbox",
                    "sandbox.client",
                    "sandbox.protocols",
                    "sandbox.models",
                    "sandbox.errors",
                }:
                    violations.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert not violations, "rollout/ uses the sandbox gateway client only:\n" + "\n".join(violations)
