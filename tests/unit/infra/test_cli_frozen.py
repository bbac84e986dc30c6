"""The `stacx` command line is frozen: every command, flag, type and default is listed in
`cli_surface.txt` beside this file, and a flag added or changed by hand fails here (torchtitan's
`test_no_new_cli_options`). A setting belongs in its section of the config tree, where it is
validated with its field path; when a change of the surface is intended, rewrite the list with
`STACX_FREEZE_CLI=1 pytest tests/unit/infra/test_cli_frozen.py` and review its diff."""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from stacx.infra.cli import build_parser

FROZEN = Path(__file__).with_name("cli_surface.txt")


def _action(action: argparse.Action) -> str:
    name = "/".join(action.option_strings) or action.dest
    kind = type(action).__name__.removeprefix("_").removesuffix("Action")
    parts = [name, kind]
    if action.type is not None:
        parts.append(f"type={getattr(action.type, '__name__', type(action.type).__name__)}")
    if action.nargs is not None:
        parts.append(f"nargs={action.nargs}")
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        parts.append(f"choices={sorted(map(str, action.choices))}")
    if action.default not in (None, False, argparse.SUPPRESS):
        parts.append(f"default={action.default!r}")
    if action.required and action.option_strings:
        parts.append("required")
    return " ".join(parts)


def surface(parser: argparse.ArgumentParser, prefix: str = "stacx") -> list[str]:
    """One line per command and per argument of it, sub-commands depth first, sorted."""
    lines = []
    for action in parser._actions:  # argparse has no public listing of a parser's arguments
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in sorted(action.choices.items()):
                lines.append(f"{prefix} {name}")
                lines += surface(sub, f"{prefix} {name}")
        elif not isinstance(action, argparse._HelpAction):
            lines.append(f"{prefix}  {_action(action)}")
    return lines


def test_the_command_line_is_the_frozen_one() -> None:
    current = surface(build_parser(every_config_flag=True))
    if os.environ.get("STACX_FREEZE_CLI") == "1":
        FROZEN.write_text("\n".join(current) + "\n")
    frozen = FROZEN.read_text().splitlines()
    diff = "\n".join(difflib.unified_diff(frozen, current, "cli_surface.txt", "stacx now", lineterm=""))
    assert current == frozen, (
        "the stacx command line changed; put a new setting in its config section instead of a flag, "
        f"or (when intended) rewrite the list: STACX_FREEZE_CLI=1 pytest {__file__}\n{diff}"
    )
