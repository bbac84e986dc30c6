"""Drives the OpenHands gateway tools (`_stacx_openhands`) without a model: runs in OpenHands'
venv, takes {"gateway_url", "gateway_token", "sandbox_session"} as JSON in argv[1], prints one
JSON object: each step's observation text, error flag and exit code."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _stacx_episode import GatewayShell
from _stacx_openhands import GatewayFileEditorExecutor, GatewayTerminalExecutor, GatewayWorkspace
from openhands.tools.file_editor.definition import FileEditorAction
from openhands.tools.terminal.definition import TerminalAction


def main() -> None:
    spec = json.loads(sys.argv[1])
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        workspace = GatewayWorkspace.open(GatewayShell(spec), scratch)
        terminal = GatewayTerminalExecutor(workspace)
        editor = GatewayFileEditorExecutor(workspace, Path(scratch) / "mirror")
        steps: list[tuple[str, Any]] = [
            ("cd", (terminal, TerminalAction(command="mkdir -p pkg && cd pkg"))),
            ("pwd", (terminal, TerminalAction(command="pwd"))),
            (
                "create",
                (
                    editor,
                    FileEditorAction(
                        command="create", path="/app/pkg/mod.py", file_text="def f():\n    return 1\n"
                    ),
                ),
            ),
            (
                "replace",
                (
                    editor,
                    FileEditorAction(
                        command="str_replace", path="/app/pkg/mod.py", old_str="return 1", new_str="return 2"
                    ),
                ),
            ),
            ("view_file", (editor, FileEditorAction(command="view", path="/app/pkg/mod.py"))),
            ("view_dir", (editor, FileEditorAction(command="view", path="/app"))),
            ("undo", (editor, FileEditorAction(command="undo_edit", path="/app/pkg/mod.py"))),
            (
                "bad_replace",
                (
                    editor,
                    FileEditorAction(
                        command="str_replace", path="/app/pkg/mod.py", old_str="no such text", new_str="x"
                    ),
                ),
            ),
            ("input", (terminal, TerminalAction(command="y", is_input=True))),
            ("slow", (terminal, TerminalAction(command="sleep 5", timeout=1))),
            ("failing", (terminal, TerminalAction(command="exit 7"))),
            # Hostile: a path with a space and a quote, a relative path, our own marker in the output.
            (
                "odd_create",
                (editor, FileEditorAction(command="create", path="/app/we ird's/x.txt", file_text="odd\n")),
            ),
            ("odd_dir", (terminal, TerminalAction(command='mkdir -p "/app/we ird\'s"'))),
            (
                "odd_create_again",
                (editor, FileEditorAction(command="create", path="/app/we ird's/x.txt", file_text="odd\n")),
            ),
            ("relative_view", (editor, FileEditorAction(command="view", path="we ird's/x.txt"))),
            ("marker", (terminal, TerminalAction(command="echo __STACX_CWD__/nowhere; cd /tmp"))),
            ("after_marker", (terminal, TerminalAction(command="pwd"))),
        ]
        for name, (executor, action) in steps:
            obs = executor(action)
            out[name] = {
                "text": obs.text,
                "error": obs.is_error,
                "exit_code": getattr(obs, "exit_code", None),
            }
        out["num_commands"] = workspace.num_commands
        out["sandbox_dir"] = workspace.sandbox_dir
    print(json.dumps(out))


if __name__ == "__main__":
    main()
