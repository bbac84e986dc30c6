"""Harbor-format task directories: load, validate, discover, and normalise into `TaskSample`s.

A task directory holds `task.toml` (`[task]`, `[metadata]`, `[verifier]`, `[agent]`,
`[environment]`), `instruction.md`, `environment/Dockerfile` (or `[environment] docker_image`),
`tests/test.sh` and, optionally, `solution/solve.sh`.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.errors import TaskFormatError
from schemas.records import TaskSample

__all__ = ["HarborTask", "discover_tasks", "load_task", "to_task_sample"]

_INTERNET_MODES = {"bridge", "host", "internet", "public"}


@dataclass(kw_only=True, slots=True)
class HarborTask:
    """One loaded task directory."""

    name: str
    """`[task] name`, else the directory name."""
    path: Path
    """Absolute task directory."""
    instruction: str
    """Content of instruction.md (what the agent is told)."""
    description: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    """`[metadata]` as written."""
    verifier_timeout_s: float = 600.0
    verifier_env: dict[str, str] = field(default_factory=dict)
    agent_timeout_s: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    build_timeout_s: float = 600.0
    wants_internet: bool = False
    """The task asks for network access; sandboxes never have any, so such tasks may fail."""
    docker_image: str | None = None
    """Prebuilt image named by `[environment] docker_image` (instead of a Dockerfile)."""

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()

    @property
    def slug(self) -> str:
        """Name usable in image tags and ids (lowercase, [a-z0-9._-])."""
        return re.sub(r"[^a-z0-9._-]+", "-", self.name.lower()).strip("-._") or "task"

    @property
    def image_tag(self) -> str:
        """Image for this task: `docker_image`, else a tag that changes with environment/."""
        if self.docker_image:
            return self.docker_image
        return f"stacx-task/{self.slug}:{_tree_digest(self.environment_dir)[:12]}"


def _tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for child in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(child.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(child.read_bytes() + b"\0")
    return digest.hexdigest()


def _table(doc: dict[str, Any], name: str, where: Path) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise TaskFormatError(f"{where}: [{name}] must be a table, got {type(value).__name__}")
    return value


def _number(table: dict[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskFormatError(f"{where} {key} must be a positive number, got {value!r}")
    return float(value)


def _wants_internet(env: dict[str, Any]) -> bool:
    mode = str(env.get("network_mode", env.get("network", "none"))).lower()
    return bool(env.get("allow_internet", False)) or mode in _INTERNET_MODES


def load_task(path: str | Path) -> HarborTask:
    """Load and validate one task directory; `TaskFormatError` names the file and field at fault."""
    root = Path(path).resolve()
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise TaskFormatError(f"{root} is not a Harbor task: task.toml is missing")
    try:
        doc = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskFormatError(f"{toml_path}: invalid TOML ({exc})") from exc
    task, env = _table(doc, "task", toml_path), _table(doc, "environment", toml_path)
    verifier, agent = _table(doc, "verifier", toml_path), _table(doc, "agent", toml_path)
    instruction = root / "instruction.md"
    if not instruction.is_file():
        raise TaskFormatError(f"{root}: instruction.md is missing (the agent's instruction)")
    if not (root / "tests" / "test.sh").is_file():
        raise TaskFormatError(f"{root}: tests/test.sh is missing (the verifier entry point)")
    docker_image = env.get("docker_image")
    if not docker_image and not (root / "environment" / "Dockerfile").is_file():
        raise TaskFormatError(
            f"{root}: environment/Dockerfile is missing (or set [environment] docker_image)"
        )
    return HarborTask(
        name=str(task.get("name") or root.name),
        path=root,
        instruction=instruction.read_text(),
        description=str(task.get("description", "")),
        metadata=_table(doc, "metadata", toml_path),
        verifier_timeout_s=_number(verifier, "timeout_sec", 600.0, f"{toml_path} [verifier]"),
        verifier_env={str(k): str(v) for k, v in dict(verifier.get("env", {})).items()},
        agent_timeout_s=_number(agent, "timeout_sec", 600.0, f"{toml_path} [agent]"),
        cpus=_number(env, "cpus", 1.0, f"{toml_path} [environment]"),
        memory_mb=int(_number(env, "memory_mb", 2048, f"{toml_path} [environment]")),
        build_timeout_s=_number(env, "build_timeout_sec", 600.0, f"{toml_path} [environment]"),
        wants_internet=_wants_internet(env),
        docker_image=str(docker_image) if docker_image else None,
    )


def discover_tasks(root: str | Path, *, max_depth: int = 3) -> list[HarborTask]:
    """Every task under `root` (or `root` itself), sorted by name; all errors reported at once."""
    base = Path(root)
    if (base / "task.toml").is_file():
        return [load_task(base)]
    if not base.is_dir():
        raise TaskFormatError(f"{base} is not a directory")
    found = sorted(
        p.parent
        for p in base.rglob("task.toml")
        if len(p.relative_to(base).parts) <= max_depth + 1
        and not any(part.startswith(".") for part in p.relative_to(base).parts)
    )
    tasks, errors = [], []
    for directory in found:
        try:
            tasks.append(load_task(directory))
        except TaskFormatError as exc:
            errors.append(str(exc))
    if errors:
        raise TaskFormatError("; ".join(errors))
    if not tasks:
        raise TaskFormatError(f"no task.toml under {base}")
    return sorted(tasks, key=lambda t: t.name)


def to_task_sample(task: HarborTask) -> TaskSample:
    """The `TaskSample` a rollout worker needs to run `task` through the gateway."""
    data = {
        "agent_timeout_s": task.agent_timeout_s,
        "verifier_timeout_s": task.verifier_timeout_s,
        "cpus": task.cpus,
        "memory_mb": task.memory_mb,
        "has_solution": task.has_solution,
    }
    return TaskSample(
        task_id=task.slug,
        task_type=str(task.metadata.get("category") or "harbor"),
        prompt=task.instruction,
        data=json.dumps(data, sort_keys=True),
        task_dir=str(task.path),
        image=task.image_tag,
        metadata={str(k): v if isinstance(v, str) else json.dumps(v) for k, v in task.metadata.items()},
    )
