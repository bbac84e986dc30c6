"""Every program the code runs is installed by `stacx infra up` (infra/services/tools.py).

A fresh machine has nothing installed by hand: when code starts calling a new program, this test
fails until the program is listed in `tools.TOOLS` with the Debian package that provides it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from stacx.infra.services import tools

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("schemas", "producers", "consumers", "rollout", "sandbox", "trainer", "infra", "bench")
SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call", "create_subprocess_exec"}
SYSTEM_PATH = re.compile(r"^/usr/(?:local/)?s?bin/([\w.+-]+)$")
NOT_PROGRAMS = {"python", "python3"}
"""Run through sys.executable or inside a sandbox image, never looked up on the host."""


def _literal_program(node: ast.AST | None, names: dict[str, ast.AST]) -> str | None:
    if isinstance(node, ast.Name):
        node = names.get(node.id)
    if not isinstance(node, ast.List) or not node.elts:
        return None
    first = node.elts[0]
    if isinstance(first, ast.Starred):
        return _literal_program(first.value, names)
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _scopes(tree: ast.AST) -> list[ast.AST]:
    return [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]


def _programs_in(tree: ast.AST) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for scope in _scopes(tree):  # names resolve within one function (each has its own `cmd`)
        body = list(ast.iter_child_nodes(scope)) if scope is tree else [scope]
        names: dict[str, ast.AST] = {}
        for node in (n for part in body for n in ast.walk(part)):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                names[node.targets[0].id] = node.value
        for node in (n for part in body for n in ast.walk(part)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                found += _called(node, names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = SYSTEM_PATH.match(node.value)
            if match:
                found.append((match.group(1), node.lineno))
    return found


def _called(node: ast.Call, names: dict[str, ast.AST]) -> list[tuple[str, int]]:
    assert isinstance(node.func, ast.Attribute)
    first = node.args[0]
    if node.func.attr == "which" and isinstance(first, ast.Constant):
        return [(str(first.value), node.lineno)]
    if node.func.attr not in SUBPROCESS_CALLS:
        return []
    if node.func.attr == "create_subprocess_exec" and isinstance(first, ast.Constant):
        return [(str(first.value), node.lineno)]
    program = _literal_program(first, names)
    return [(program, node.lineno)] if program else []


def _all_programs() -> list[tuple[str, str]]:
    programs = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for program, line in _programs_in(ast.parse(path.read_text(), str(path))):
                programs.append((Path(program).name, f"{path.relative_to(ROOT)}:{line}"))
    return programs


def test_the_scan_finds_the_programs_we_know_the_code_runs() -> None:
    found = {program for program, _ in _all_programs()}
    assert {"docker", "dockerd", "bwrap", "debootstrap", "mvn", "tar"} <= found


def test_every_program_the_code_runs_is_installed_by_infra_up() -> None:
    unlisted = [
        f"{where} runs `{program}`"
        for program, where in _all_programs()
        if program not in tools.TOOLS and program not in NOT_PROGRAMS
    ]
    assert not unlisted, (
        "programs the code runs that `stacx infra up` does not install; add each to "
        "infra/services/tools.py TOOLS with its Debian package:\n" + "\n".join(unlisted)
    )


def test_every_listed_tool_names_a_package() -> None:
    for tool in tools.TOOLS.values():
        assert tool.package and tool.used_by, tool


def test_ensure_refuses_clearly_when_it_cannot_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.shutil, "which", lambda name: None if name == "bwrap" else "/bin/x")
    monkeypatch.setattr(tools.os, "geteuid", lambda: 1000)
    with pytest.raises(tools.InfraError, match=r"`bwrap` .*bubblewrap"):
        tools.ensure(["bwrap"])


def test_ensure_installs_the_missing_packages_once(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: set[str] = set()
    commands: list[list[str]] = []

    def which(name: str) -> str | None:
        return f"/usr/bin/{name}" if name in installed or name not in ("bwrap", "debootstrap") else None

    def run(cmd: list[str], **_: object) -> object:
        commands.append(cmd)
        if cmd[:2] == ["apt-get", "install"]:
            installed.update({"bwrap", "debootstrap"})

        class Done:
            returncode, stdout, stderr = 0, "", ""

        return Done()

    monkeypatch.setattr(tools.shutil, "which", which)
    monkeypatch.setattr(tools.os, "geteuid", lambda: 0)
    monkeypatch.setattr(tools.subprocess, "run", run)
    assert tools.ensure(say=lambda _: None) == ["bubblewrap", "debootstrap"]
    assert commands[-1] == ["apt-get", "install", "-y", "-qq", "bubblewrap", "debootstrap"]
    assert tools.ensure(say=lambda _: None) == []
