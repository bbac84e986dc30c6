"""Checks of what a config points at, shared by `stacx run`, `stacx rollout`, `stacx eval` and
`stacx train`: a model directory and its tokenizer, Harbor task folders, tasks.jsonl files, and the
rollout manager's scaffolds, rewards, strategy and budget. Each problem is one line; nothing starts.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "harbor_problems",
    "jsonl_problems",
    "model_problem",
    "plugin_problems",
    "rollout_config_problem",
    "rollout_problems",
    "tokenizer_problem",
]


def model_problem(path: Path, what: str) -> str | None:
    """None when `path` is a Hugging Face model directory with a tokenizer that loads."""
    if not path.is_dir():
        return f"{what}={path}: no such directory (`stacx models tiny --out DIR` makes a small model)"
    config = path / "config.json"
    try:
        json.loads(config.read_text())
    except FileNotFoundError:
        return f"{what}={path}: no config.json; point it at a Hugging Face model directory"
    except (OSError, ValueError) as exc:
        return f"{what}={path}: config.json does not load ({exc})"
    return tokenizer_problem(path, what)


def tokenizer_problem(path: Path, what: str) -> str | None:
    from stacx.rollout.tokens import load_tokenizer

    if not path.is_dir():
        return f"{what}={path}: no such directory; point it at the model directory"
    try:
        load_tokenizer(path)
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a bad directory
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{what}={path}: the tokenizer does not load ({first})"
    return None


_PROBE_TASK = {"task_id": "check", "task_type": "check", "prompt": "check"}
"""Stands in for the real tasks while the manager is built (never run)."""


def plugin_problems(config: Any) -> list[str]:
    """One `field.path: problem` line per plug-in of a `RolloutConfig` that does not resolve:
    each evaluator's scaffold, reward, verifier; the scheduler's strategy; the data source."""
    from stacx.rollout.blackbox.adapter import build_external, is_external
    from stacx.rollout.errors import ConfigError as RolloutConfigError
    from stacx.rollout.rewards import get_reward, get_verifier
    from stacx.rollout.scaffolds import build_scaffold
    from stacx.rollout.scheduler import build_strategy

    checks: list[tuple[str, Any]] = []
    for name, e in config.manager.evaluators.items():
        where = f"manager.evaluators.{name}"
        if is_external(e.scaffold):
            checks.append((f"{where}.scaffold", partial(build_external, e.scaffold, e.scaffold_options)))
        else:
            checks.append((f"{where}.scaffold", partial(build_scaffold, e.scaffold, **e.scaffold_options)))
        if e.reward == "verifier":
            checks.append((f"{where}.verifier", partial(get_verifier, e.verifier, e.verifier_options)))
        else:
            checks.append((f"{where}.reward", partial(get_reward, e.reward, e.reward_options)))
    checks.append(("manager.scheduler.strategy", lambda: build_strategy(config.manager.scheduler)))
    if config.data.source:
        from stacx.rollout.data import build_task_set

        checks.append(("data.source", lambda: build_task_set(config.data.source, config.data.source_options)))
    lines = []
    for field, check in checks:
        try:
            check()
        except RolloutConfigError as exc:
            lines.append(f"{field}: {exc}")
    return lines


def rollout_config_problem(config: Any) -> str | None:
    """None when `config`'s evaluators, scheduler and pool resolve; else the problem."""
    from stacx.rollout.data import ListTaskSource, task_from_dict
    from stacx.rollout.errors import RolloutError
    from stacx.rollout.fakes import (
        FakeCapture,
        FakeEnvironments,
        FakeTokenizer,
        MemoryPublisher,
        ScriptedInference,
    )
    from stacx.rollout.manager import RolloutManager

    tokenizer = FakeTokenizer()
    try:
        RolloutManager(
            config.manager,
            source=ListTaskSource([task_from_dict(_PROBE_TASK, where="check")]),
            tokenizer=tokenizer,
            inference=ScriptedInference(tokenizer, lambda *_: ""),
            publisher=MemoryPublisher(),
            sandbox=FakeEnvironments() if config.sandbox is not None else None,
            # the rollout service always starts the agent proxy for black-box scaffolds
            capture=FakeCapture(),  # type: ignore[arg-type]
        )
    except RolloutError as exc:
        return str(exc)
    return None


def harbor_problems(root: Path, what: str) -> list[str]:
    """One line per task under `root` that does not load or cannot run here; none found is one."""
    from stacx.sandbox.errors import SandboxError
    from stacx.sandbox.tasks import find_task_dirs, load_task

    try:
        directories = find_task_dirs(root)
    except SandboxError as exc:
        return [f"{what}={root}: {exc}"]
    if not directories:
        return [f"{what}={root}: no Harbor task (a folder with task.toml) under it"]
    lines = []
    for directory in directories:
        try:
            task = load_task(directory)
        except SandboxError as exc:
            message = str(exc).splitlines()[0]
            lines.append(f"{what}: {message if str(directory) in message else f'{directory}: {message}'}")
            continue
        if task.unsupported:
            lines.append(f"{what}: {directory}: {task.unsupported}")
    return lines


def jsonl_problems(path: Path, what: str) -> list[str]:
    """One line per bad row of a tasks.jsonl (at most 5); an empty or missing file is one."""
    from stacx.rollout.data import task_from_dict
    from stacx.rollout.errors import ConfigError as RolloutConfigError

    if not path.is_file():
        return [f"{what}={path}: no such file"]
    bad: list[tuple[int, str]] = []
    rows = 0
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        rows += 1
        try:
            task_from_dict(json.loads(text), where=f"{path}:{number}")
        except json.JSONDecodeError as exc:
            bad.append((number, f"{path}:{number}: not valid JSON ({exc.msg})"))
        except (ValueError, TypeError, RolloutConfigError) as exc:  # the message names path:line
            message = str(exc).splitlines()[0]
            bad.append((number, message if message.startswith(f"{path}:") else f"{path}:{number}: {message}"))
    lines = bad_row_lines(bad, what, f"{path} line")
    if rows == 0:
        lines.append(f"{what}={path}: the file has no tasks")
    return lines


MAX_ROW_LINES = 20
"""Bad task rows said one line each; the line numbers of any further ones fill one more line."""


def bad_row_lines(bad: list[tuple[int, str]], what: str, unit: str) -> list[str]:
    """One line per bad row (number, problem), the first `MAX_ROW_LINES`; then one line with the
    numbers of all the others, so every bad row is named in one pass."""
    lines = [f"{what}: {problem}" for _, problem in bad[:MAX_ROW_LINES]]
    rest = [str(number) for number, _ in bad[MAX_ROW_LINES:]]
    if rest:
        lines.append(f"{what}: {len(rest)} more bad rows, {unit}s {', '.join(rest)}")
    return lines


def rollout_problems(config: Any, where: str) -> list[str]:
    """Everything a `RolloutConfig` points at: plug-ins, evaluators, tokenizer, task file or folder."""
    lines = [f"{where}: {line}" for line in plugin_problems(config)]
    problem = None if lines else rollout_config_problem(config)
    if problem:
        lines.append(f"{where}: manager: {problem}")
    if not config.inference.tokenizer:
        lines.append(f"{where}: inference.tokenizer: required; point it at the model directory")
    else:
        problem = tokenizer_problem(Path(config.inference.tokenizer), "inference.tokenizer")
        if problem:
            lines.append(f"{where}: {problem}")
    if config.data.path:
        lines += [f"{where}: {line}" for line in jsonl_problems(Path(config.data.path), "data.path")]
    if config.data.task_dirs:
        lines += [
            f"{where}: {line}" for line in harbor_problems(Path(config.data.task_dirs), "data.task_dirs")
        ]
    return lines
