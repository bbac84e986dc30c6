"""OpenHands' workspace and tools over the STACX sandbox gateway (runs in OpenHands' own venv).

`GatewayWorkspace` implements the SDK's workspace interface (`execute_command`, `file_upload`,
`file_download`, `git_changes`, `git_diff`) with the gateway's exec route: every command runs in
the episode's sandbox. The SDK's local conversation keeps its own bookkeeping (event store, skill
lookup) in `working_dir`, an empty scratch directory here; the agent works in `sandbox_dir`, the
sandbox's WORKDIR.

The agent's tools are OpenHands' own `terminal` and `file_editor` (same names, descriptions and
parameters, so the model sees exactly what OpenHands shows it) with executors of ours:

- terminal: each command is `bash -c` in the sandbox, starting in the directory the previous one
  ended in; interactive input (`is_input`) is refused with an error observation;
- file_editor: OpenHands' own `FileEditor` edits a mirror of the touched path (the file, or a
  directory's two levels of names), and a changed file is written back into the sandbox, so the
  editor's checks, messages and undo history are OpenHands' own.
"""

from __future__ import annotations

import base64
import shlex
from pathlib import Path
from typing import Any

from _stacx_episode import GatewayShell
from openhands.sdk.git.models import GitChange, GitChangeStatus, GitDiff
from openhands.sdk.tool import ToolExecutor, register_tool
from openhands.sdk.workspace import LocalWorkspace
from openhands.sdk.workspace.models import CommandResult, FileOperationResult
from openhands.tools.file_editor.definition import FileEditorAction, FileEditorObservation, FileEditorTool
from openhands.tools.file_editor.editor import FileEditor
from openhands.tools.file_editor.exceptions import ToolError
from openhands.tools.terminal.definition import TerminalAction, TerminalObservation, TerminalTool
from openhands.tools.terminal.metadata import CmdOutputMetadata
from pydantic import PrivateAttr

__all__ = [
    "FILE_EDITOR",
    "TERMINAL",
    "GatewayFileEditorExecutor",
    "GatewayTerminalExecutor",
    "GatewayWorkspace",
]

TERMINAL = "stacx_gateway_terminal"
FILE_EDITOR = "stacx_gateway_file_editor"
"""Registry names of the gateway tools (the model sees them as `terminal` and `file_editor`)."""

_CWD_MARK = "__STACX_CWD__"


class GatewayWorkspace(LocalWorkspace):
    """The episode's sandbox as an OpenHands workspace (see the module docstring)."""

    sandbox_dir: str
    """The agent's working directory inside the sandbox (the image's WORKDIR)."""
    command_timeout_s: float = 60.0
    _shell: GatewayShell = PrivateAttr()
    _num_commands: int = PrivateAttr(default=0)

    @classmethod
    def open(cls, shell: GatewayShell, scratch: str) -> GatewayWorkspace:
        """A workspace on `shell`'s session; its WORKDIR is asked from the sandbox itself."""
        done = shell.run("pwd")
        if done["exit_code"] != 0:
            raise RuntimeError(f"the sandbox does not answer 'pwd': {done['stderr'][:300]}")
        workspace = cls(
            working_dir=scratch, sandbox_dir=done["stdout"].strip() or "/", command_timeout_s=shell.timeout_s
        )
        workspace._shell = shell
        return workspace

    @property
    def num_commands(self) -> int:
        """Commands the agent's tools ran in the sandbox."""
        return self._num_commands

    def run(
        self, command: str, *, cwd: str | None = None, timeout: float | None = None, stdin: str | None = None
    ) -> dict[str, Any]:
        """The gateway's ExecResult of `command` in the sandbox."""
        return self._shell.run(
            command, timeout_s=timeout or self.command_timeout_s, workdir=cwd or self.sandbox_dir, stdin=stdin
        )

    def count_command(self) -> None:
        self._num_commands += 1

    def execute_command(
        self, command: str, cwd: str | Path | None = None, timeout: float = 30.0
    ) -> CommandResult:
        done = self.run(command, cwd=str(cwd) if cwd is not None else None, timeout=timeout)
        return CommandResult(
            command=command,
            exit_code=done["exit_code"],
            stdout=done["stdout"],
            stderr=done["stderr"],
            timeout_occurred=bool(done.get("timed_out")),
        )

    def file_upload(self, source_path: str | Path, destination_path: str | Path) -> FileOperationResult:
        data = Path(source_path).read_bytes()
        self.write_bytes(str(destination_path), data)
        return FileOperationResult(
            success=True,
            source_path=str(source_path),
            destination_path=str(destination_path),
            file_size=len(data),
        )

    def file_download(self, source_path: str | Path, destination_path: str | Path) -> FileOperationResult:
        data = self.read_bytes(str(source_path))
        Path(destination_path).parent.mkdir(parents=True, exist_ok=True)
        Path(destination_path).write_bytes(data)
        return FileOperationResult(
            success=True,
            source_path=str(source_path),
            destination_path=str(destination_path),
            file_size=len(data),
        )

    def git_changes(self, path: str | Path) -> list[GitChange]:
        done = self._checked(f"git -C {shlex.quote(str(path))} status --porcelain --no-renames")
        kinds = {"A": GitChangeStatus.ADDED, "?": GitChangeStatus.ADDED, "D": GitChangeStatus.DELETED}
        changes = []
        for line in done.splitlines():
            code, name = line[:2].strip() or "M", line[3:]
            changes.append(GitChange(status=kinds.get(code[0], GitChangeStatus.UPDATED), path=Path(name)))
        return changes

    def git_diff(self, path: str | Path) -> GitDiff:
        target = Path(str(path))
        quoted = shlex.quote(target.name)
        where = str(target.parent)
        original = self.run(f"git show HEAD:./{quoted}", cwd=where)
        modified = self.run(f"cat -- {quoted}", cwd=where)
        return GitDiff(
            modified=modified["stdout"] if modified["exit_code"] == 0 else None,
            original=original["stdout"] if original["exit_code"] == 0 else None,
        )

    def read_bytes(self, path: str) -> bytes:
        return base64.b64decode(self._checked(f"base64 < {shlex.quote(path)}"))

    def write_bytes(self, path: str, data: bytes) -> None:
        target = shlex.quote(path)
        self._checked(
            f'mkdir -p "$(dirname {target})" && base64 -d > {target}', stdin=base64.b64encode(data).decode()
        )

    def _checked(self, command: str, stdin: str | None = None) -> str:
        done = self.run(command, stdin=stdin)
        if done["exit_code"] != 0:
            raise RuntimeError(f"{command[:80]!r} failed in the sandbox: {done['stderr'][:300]}")
        return str(done["stdout"])


def _workspace(conv_state: Any) -> GatewayWorkspace:
    workspace = conv_state.workspace
    if not isinstance(workspace, GatewayWorkspace):
        raise TypeError(f"the gateway tools need a GatewayWorkspace, not {type(workspace).__name__}")
    return workspace


class GatewayTerminalExecutor(ToolExecutor[TerminalAction, TerminalObservation]):
    """OpenHands' terminal action as one `bash -c` in the sandbox (the directory carries over)."""

    def __init__(self, workspace: GatewayWorkspace) -> None:
        self.workspace = workspace
        self.cwd = workspace.sandbox_dir

    def __call__(self, action: TerminalAction, conversation: Any = None) -> TerminalObservation:
        if action.is_input:
            return TerminalObservation.from_text(
                text="interactive input is not supported here: run commands that end by themselves",
                command=action.command,
                is_error=True,
            )
        if action.reset:
            self.cwd = self.workspace.sandbox_dir
        if not action.command.strip():
            return TerminalObservation.from_text(
                text="", command=action.command, exit_code=0, metadata=self._metadata(0)
            )
        self.workspace.count_command()
        script = f'{action.command}\n__rc=$?; printf "\\n{_CWD_MARK}%s" "$(pwd)"; exit $__rc'
        done = self.workspace.run(script, cwd=self.cwd, timeout=action.timeout)
        output, _, cwd = str(done["stdout"]).rpartition(_CWD_MARK)
        if _CWD_MARK in str(done["stdout"]) and cwd:
            self.cwd, output = cwd.strip(), output.removesuffix("\n")
        else:
            output = str(done["stdout"])
        text = output + str(done["stderr"])
        timed_out = bool(done.get("timed_out"))
        code = -1 if timed_out else int(done["exit_code"])
        if timed_out:
            text += (
                f"\n[the command timed out after {action.timeout or self.workspace.command_timeout_s:g} s]"
            )
        return TerminalObservation.from_text(
            text=text,
            command=action.command,
            exit_code=code,
            timeout=timed_out,
            metadata=self._metadata(code),
        )

    def _metadata(self, code: int) -> CmdOutputMetadata:
        return CmdOutputMetadata(exit_code=code, working_dir=self.cwd)


class GatewayTerminalTool(TerminalTool):
    """OpenHands' `terminal` tool, run in the sandbox."""

    name = "terminal"

    @classmethod
    def create(cls, conv_state: Any, **params: Any) -> list[TerminalTool]:  # type: ignore[override]
        workspace = _workspace(conv_state)
        # The parent's factory checks its working_dir on this host: give it the scratch dir and
        # our executor, so the tool's description and schema stay OpenHands' own.
        return list(TerminalTool.create(conv_state, executor=GatewayTerminalExecutor(workspace)))


class GatewayFileEditorExecutor(ToolExecutor[FileEditorAction, FileEditorObservation]):
    """OpenHands' FileEditor on a mirror of the touched path; changes go back into the sandbox."""

    def __init__(self, workspace: GatewayWorkspace, mirror: Path) -> None:
        self.workspace = workspace
        self.mirror = mirror
        self.editor = FileEditor()

    def __call__(self, action: FileEditorAction, conversation: Any = None) -> FileEditorObservation:
        path = action.path
        if not path.startswith("/"):
            path = f"{self.workspace.sandbox_dir.rstrip('/')}/{path}"
        local = self.mirror / path.lstrip("/")
        self.workspace.count_command()
        before = self._pull(path, local)
        try:
            result = self.editor(
                command=action.command,
                path=str(local),
                file_text=action.file_text,
                view_range=action.view_range,
                old_str=action.old_str,
                new_str=action.new_str,
                insert_line=action.insert_line,
            )
        except ToolError as exc:
            result = FileEditorObservation.from_text(text=exc.message, command=action.command, is_error=True)
        if local.is_file() and local.read_bytes() != before:
            self.workspace.write_bytes(path, local.read_bytes())
        return self._unmirror(result)

    def _pull(self, path: str, local: Path) -> bytes | None:
        """Bring `path` into the mirror: a file's bytes, a directory's names two levels deep, or
        (for a path not there yet) its parent directory when the sandbox has it."""
        quoted = shlex.quote(path)
        kind = self.workspace.run(
            f"if [ -d {quoted} ]; then echo dir; elif [ -f {quoted} ]; then echo file; "
            f'elif [ -d "$(dirname {quoted})" ]; then echo parent; fi'
        )
        found = str(kind["stdout"]).strip()
        if found == "file":
            data = self.workspace.read_bytes(path)
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)
            return data
        if found == "dir":
            self._pull_names(path, local)
            return None
        if local.is_file():
            local.unlink()  # gone from the sandbox: gone from the mirror
        if found == "parent":
            local.parent.mkdir(parents=True, exist_ok=True)
        return None

    def _pull_names(self, path: str, local: Path) -> None:
        names = self.workspace.run(
            f"cd {shlex.quote(path)} && find . -mindepth 1 -maxdepth 2 \\( -type d -printf 'd %P\\n' \\)"
            " -o -printf 'f %P\\n'"
        )
        local.mkdir(parents=True, exist_ok=True)
        for line in str(names["stdout"]).splitlines():
            kind, _, name = line.partition(" ")
            entry = local / name
            if kind == "d":
                entry.mkdir(parents=True, exist_ok=True)
            elif not entry.exists():
                entry.parent.mkdir(parents=True, exist_ok=True)
                entry.touch()

    def _unmirror(self, result: FileEditorObservation) -> FileEditorObservation:
        root = str(self.mirror)
        content = [
            c.model_copy(update={"text": c.text.replace(root, "")}) if hasattr(c, "text") else c
            for c in result.content
        ]
        update: dict[str, Any] = {"content": content}
        if result.path:
            update["path"] = result.path.replace(root, "")
        return result.model_copy(update=update)


class GatewayFileEditorTool(FileEditorTool):
    """OpenHands' `file_editor` tool, editing files in the sandbox."""

    name = "file_editor"

    @classmethod
    def create(cls, conv_state: Any, **params: Any) -> list[FileEditorTool]:  # type: ignore[override]
        workspace = _workspace(conv_state)
        mirror = Path(workspace.working_dir) / ".stacx-mirror"
        [tool] = FileEditorTool.create(conv_state)
        # Its description names the working directory: the sandbox's, not the scratch dir.
        description = tool.description.replace(workspace.working_dir, workspace.sandbox_dir)
        executor = GatewayFileEditorExecutor(workspace, mirror)
        return [tool.model_copy(update={"executor": executor, "description": description})]


register_tool(TERMINAL, GatewayTerminalTool)
register_tool(FILE_EDITOR, GatewayFileEditorTool)
