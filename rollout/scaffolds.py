"""Agent runtimes (scaffolds) by name (`scaffold:`): the built-in ReTool-style Python tool calling,
Terminus-style terminal agent and single-turn completion, any registered one, a dotted path
`package.module:Factory`, or an entry point in `stacx.scaffolds`. A scaffold factory is called with
the evaluator's `scaffold_options`. All parsing is total: model output never raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stacx.rollout.errors import ConfigError
from stacx.rollout.protocols import Action, ExecResult, Message, Observation, Scaffold
from stacx.schemas.plugins import PluginError, Registry
from stacx.schemas.records import TaskSample

__all__ = [
    "SCAFFOLDS",
    "SingleTurnScaffold",
    "TerminalScaffold",
    "ToolCallingScaffold",
    "build_scaffold",
    "extract_answer",
]

_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_BOXES = ("\\boxed{", "\\fbox{")
_BARE_BOX = "\\boxed "
_TOOL_OPEN = "<tool_call>"
_TOOL_CLOSE = "</tool_call>"


def _closing_braces(text: str) -> dict[int, int]:
    """For every `{` of `text` that is closed, the index of its `}` (one pass: long hostile
    completions stay linear)."""
    closing: dict[int, int] = {}
    opened: list[int] = []
    for i, char in enumerate(text):
        if char == "{":
            opened.append(i)
        elif char == "}" and opened:
            closing[opened.pop()] = i
    return closing


def _tagged_answers(text: str) -> list[tuple[int, str]]:
    """(position, content) of every `<answer>...</answer>`, left to right (linear, unlike a lazy
    regex on a completion full of unclosed tags)."""
    found: list[tuple[int, str]] = []
    start = text.find(_ANSWER_OPEN)
    while start >= 0:
        end = text.find(_ANSWER_CLOSE, start + len(_ANSWER_OPEN))
        if end < 0:
            break
        found.append((start, text[start + len(_ANSWER_OPEN):end]))
        start = text.find(_ANSWER_OPEN, end + len(_ANSWER_CLOSE))
    return found


def _marked_answers(text: str) -> list[tuple[int, str]]:
    """(position, content) of every `<answer>...</answer>`, closed `\\boxed{...}` and `\\fbox{...}`,
    and `\\boxed X` (MATH's unbraced form, up to the next `$` or line end) in `text`."""
    found = _tagged_answers(text)
    closing = _closing_braces(text) if any(marker in text for marker in _BOXES) else {}
    for marker in _BOXES:
        for m in re.finditer(re.escape(marker), text):
            end = closing.get(m.end() - 1)
            if end is not None:
                found.append((m.start(), text[m.end():end]))
    for m in re.finditer(re.escape(_BARE_BOX), text):
        found.append((m.start(), re.split(r"[$\n]", text[m.end():], maxsplit=1)[0]))
    return found


def extract_answer(text: str) -> str | None:
    """The last marked answer in `text`, stripped: whichever of `<answer>...</answer>`,
    `\\boxed{...}`, `\\fbox{...}` or `\\boxed X` comes last; None if there is none."""
    found = _marked_answers(text)
    return max(found)[1].strip() if found else None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n...[{len(text) - limit} chars cut]"


def _output_text(result: ExecResult, limit: int) -> str:
    text = result.stdout + result.stderr
    if result.timed_out:
        text += "\n[timed out]"
    return _clip(text, limit)


def _task_messages(system: str, task: TaskSample) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": task.prompt}]


RETOOL_SYSTEM = (
    "Solve the problem. You may run Python by writing <tool_call>code</tool_call>; the output "
    "comes back as <tool_response>...</tool_response>. Give the final answer as <answer>...</answer>."
)


@dataclass(kw_only=True, slots=True)
class ToolCallingScaffold:
    """ReTool-style: `<tool_call>python</tool_call>` runs in the sandbox; the response comes back
    inline as `<tool_response>...</tool_response>` (mask 0); `<answer>` or `\\boxed{}` ends it."""

    name: str = "retool"
    needs_sandbox: bool = True
    system_prompt: str = RETOOL_SYSTEM
    max_observation_chars: int = 2000
    python: str = "python3"
    response_template: str = "\n<tool_response>\n{output}\n</tool_response>\n"
    """How the tool output is framed (inline, mask 0); `{output}` is stdout + stderr."""
    stop: list[str] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = [_TOOL_CLOSE]
        if "{output}" not in self.response_template:
            raise ConfigError("scaffold_options.response_template must contain {output}")

    def initial_messages(self, task: TaskSample) -> list[Message]:
        return _task_messages(self.system_prompt, task)

    def parse(self, text: str, *, finish_reason: str) -> Action:
        call_at = text.rfind(_TOOL_OPEN)
        answer_at = max(text.rfind("</answer>"), text.rfind("\\boxed{"))
        if call_at >= 0 and call_at > answer_at:
            return self._tool_call(text[call_at + len(_TOOL_OPEN) :], finish_reason)
        answer = extract_answer(text)
        if answer is not None:
            return Action(kind="answer", answer=answer)
        return Action(kind="invalid", reason="no <tool_call> and no <answer>/\\boxed{} in the output")

    def _tool_call(self, body: str, finish_reason: str) -> Action:
        closed = _TOOL_CLOSE in body
        code = body.split(_TOOL_CLOSE, 1)[0]
        if not closed and finish_reason == "length":
            return Action(kind="invalid", reason="tool call cut off by the token limit")
        if not code.strip():
            return Action(kind="invalid", reason="empty <tool_call>")
        return Action(
            kind="exec",
            command=self.python + " -",
            stdin=code.strip("\n") + "\n",
            tool_name="python",
            tool_arguments=json.dumps({"code": code}),
            reason="" if closed else "close-tag-missing",
        )

    def observe(self, action: Action, result: ExecResult) -> Observation:
        prefix = _TOOL_CLOSE if action.reason == "close-tag-missing" else ""
        body = _output_text(result, self.max_observation_chars)
        return Observation(text=prefix + self.response_template.replace("{output}", body))


TERMINAL_SYSTEM = (
    "You are in a Linux shell in the task's working directory. Reply with exactly one shell "
    "command as <command>...</command>; you will see its output. When the task is done reply <done/>."
)
_COMMAND = re.compile(r"<command>(.*?)(?:</command>|$)", re.DOTALL)
_FENCE = re.compile(r"```(?:bash|sh)?\n(.*?)```", re.DOTALL)


@dataclass(kw_only=True, slots=True)
class TerminalScaffold:
    """Terminus-style: one shell command per turn, output back as a user message."""

    name: str = "terminal"
    needs_sandbox: bool = True
    system_prompt: str = TERMINAL_SYSTEM
    max_observation_chars: int = 4000
    stop: list[str] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = ["</command>"]

    def initial_messages(self, task: TaskSample) -> list[Message]:
        return _task_messages(self.system_prompt, task)

    def parse(self, text: str, *, finish_reason: str) -> Action:
        if "<done/>" in text or "<task_complete>" in text:
            return Action(kind="answer", answer=None)
        commands = [c for c in _COMMAND.findall(text) if c.strip()] or _FENCE.findall(text)
        if not commands:
            return Action(kind="invalid", reason="no <command> and no <done/> in the output")
        command = commands[-1].strip()
        return Action(
            kind="exec",
            command=command,
            tool_name="shell",
            tool_arguments=json.dumps({"command": command}),
        )

    def observe(self, action: Action, result: ExecResult) -> Observation:
        body = _output_text(result, self.max_observation_chars)
        return Observation(text=f"exit code {result.exit_code}\n{body}", role="user", inline=False)


@dataclass(kw_only=True, slots=True)
class SingleTurnScaffold:
    """One completion, scored by a reward function; no sandbox."""

    name: str = "single_turn"
    needs_sandbox: bool = False
    system_prompt: str = "Give the final answer as <answer>...</answer>."
    stop: list[str] = None  # type: ignore[assignment]
    answer_required: bool = False
    """True: a completion with no `<answer>` or `\\boxed{}` has no answer (it scores 0, as the
    math suites grade); False: the whole completion is the answer."""

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []

    def initial_messages(self, task: TaskSample) -> list[Message]:
        return _task_messages(self.system_prompt, task)

    def parse(self, text: str, *, finish_reason: str) -> Action:
        answer = extract_answer(text)
        if answer is None and not self.answer_required:
            answer = text.strip()
        return Action(kind="answer", answer=answer)

    def observe(self, action: Action, result: ExecResult) -> Observation:
        return Observation(text="")


_SCAFFOLD_METHODS = ("initial_messages", "parse", "observe")


def _check(factory: Any) -> str | None:
    if not callable(factory):
        return f"is a {type(factory).__name__}, not a scaffold class or factory"
    if isinstance(factory, type):
        missing = [m for m in _SCAFFOLD_METHODS if not callable(getattr(factory, m, None))]
        if missing:
            return f"class {factory.__name__} lacks {', '.join(missing)} (stacx.rollout.protocols.Scaffold)"
    return None


SCAFFOLDS: Registry[Callable[..., Scaffold]] = Registry("scaffolds", what="scaffold", check=_check)
"""Scaffold factories (classes), each called with the evaluator's `scaffold_options`."""
for _name, _factory in (
    ("retool", ToolCallingScaffold),
    ("terminal", TerminalScaffold),
    ("single_turn", SingleTurnScaffold),
):
    SCAFFOLDS.add(_name, _factory, origin="builtin (stacx.rollout.scaffolds)")


def build_scaffold(ref: str, **options: object) -> Scaffold:
    """The scaffold `ref` names, built with its options (e.g. `system_prompt`)."""
    try:
        scaffold = SCAFFOLDS.build(ref, options_field="scaffold_options", **options)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    missing = [m for m in _SCAFFOLD_METHODS if not callable(getattr(scaffold, m, None))]
    missing += [a for a in ("name", "needs_sandbox", "stop") if not hasattr(scaffold, a)]
    if missing:
        lacks = ", ".join(missing)
        raise ConfigError(f"{ref!r}: the scaffold it built lacks {lacks} (stacx.rollout.protocols.Scaffold)")
    return scaffold
