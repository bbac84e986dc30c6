"""Every `stacx` command line the pipeline and the node agent start a service with parses with the
real `stacx` parser: a flag renamed in one place and not in the other is caught here, not when a
run's service exits 2 at start."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stacx.infra.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
STARTERS = ("infra/pipeline/orchestrator.py", "infra/pipeline/node.py")


def _argv(node: ast.List) -> list[str] | None:
    """The literal argv of a `ServiceSpec(args=[...])`, a value computed at run time as `X`;
    None where a starred part makes the length unknown."""
    argv: list[str] = []
    for element in node.elts:
        if isinstance(element, ast.Starred):
            return None
        literal = isinstance(element, ast.Constant) and isinstance(element.value, str)
        argv.append(element.value if literal else "X")  # type: ignore[union-attr]
    return argv


def _service_command_lines() -> list[tuple[str, list[str]]]:
    found = []
    for relative in STARTERS:
        tree = ast.parse((ROOT / relative).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ServiceSpec":
                if any(keyword.arg == "program" for keyword in node.keywords):
                    continue  # another program's command line (torchrun's)
                for keyword in node.keywords:
                    if keyword.arg == "args" and isinstance(keyword.value, ast.List):
                        argv = _argv(keyword.value)
                        if argv is not None:
                            found.append((f"{relative}:{node.lineno}", argv))
    return found


LINES = _service_command_lines()


def test_the_starters_have_service_command_lines() -> None:
    assert len(LINES) >= 8, LINES


@pytest.mark.parametrize(("where", "argv"), LINES, ids=[where for where, _ in LINES])
def test_a_service_command_line_parses(where: str, argv: list[str]) -> None:
    try:
        build_parser(argv).parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `stacx {' '.join(argv)}` does not parse (exit {exc.code})")
