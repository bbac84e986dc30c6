"""Harbor-format task directories: load, validate, discover, and normalise into `TaskSample`s.

A single-step task holds `task.toml`, `instruction.md`, `environment/Dockerfile` (or
`[environment] docker_image`), `tests/test.sh` and, optionally, `solution/solve.sh`. A multi-step
task (`[[steps]]`) holds `steps/<name>/instruction.md`, `steps/<name>/tests/` (merged over the
top-level `tests/`), `steps/<name>/solution/solve.sh` and `steps/<name>/workdir/` for each step.
The field rules are in `stacx.sandbox.task_config`.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacx.sandbox import task_config as tc
from stacx.sandbox.errors import TaskFormatError
from stacx.sandbox.task_config import Healthcheck, StepConfig
from stacx.schemas.records import TaskSample

__all__ = ["HarborTask", "TaskStep", "discover_tasks", "find_task_dirs", "load_task", "to_task_sample"]

_INTERNET_MODES = {"bridge", "host", "internet", "public", "allowlist"}
_OFFLINE_MODES = {"none", "no-network"}
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


@dataclass(kw_only=True, slots=True)
class TaskStep:
    """One step of a task: a single-step task has one, named after the task."""

    name: str
    dir: Path
    """Folder of the step's instruction.md, tests/, solution/, workdir/ (the task folder itself
    for a single-step task)."""
    instruction: str
    config: StepConfig

    @property
    def tests_dir(self) -> Path:
        return self.dir / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.dir / "solution"

    @property
    def workdir_dir(self) -> Path:
        """Files uploaded to the working directory before the step's agent (multi-step only)."""
        return self.dir / "workdir"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()


@dataclass(kw_only=True, slots=True)
class HarborTask:
    """One loaded task directory."""

    name: str
    """`[task] name`, else the directory name."""
    path: Path
    """Absolute task directory."""
    instruction: str
    """What the agent is told (multi-step: the first step's instruction)."""
    description: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    """`[metadata]` as written."""
    schema_version: str = "1.0"
    verifier_timeout_s: float = 600.0
    verifier_env: dict[str, str] = field(default_factory=dict)
    """`[verifier.env]` as written (`${VAR}` templates resolved when a verifier runs)."""
    agent_timeout_s: float = 600.0
    solution_env: dict[str, str] = field(default_factory=dict)
    """`[solution.env]`: environment of solve.sh."""
    env: dict[str, str] = field(default_factory=dict)
    """`[environment.env]`: environment of every command in the task's sandbox."""
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int | None = None
    gpus: int = 0
    build_timeout_s: float = 600.0
    wants_internet: bool = False
    """The task asks for network access (`allow_internet`, `network_mode = "public"`)."""
    docker_image: str | None = None
    """Prebuilt image named by `[environment] docker_image` (environment/Dockerfile is the fallback)."""
    os: str = "linux"
    workdir: str | None = None
    """`[environment] workdir`: overrides the image's WORKDIR."""
    healthcheck: Healthcheck | None = None
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    skills_dir: str | None = None
    artifacts: list[str] = field(default_factory=list)
    steps: list[TaskStep] = field(default_factory=list)
    """The steps in order (one for a single-step task)."""
    multi_step: bool = False
    multi_step_reward_strategy: str = "mean"
    """`mean` of the step rewards per key, or the `final` step's."""
    compose_file: Path | None = None
    """environment/docker-compose.yaml when the task declares sidecar services."""
    warnings: list[str] = field(default_factory=list)
    """What the task asks for that STACX does not honour (one line each)."""

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
        return bool(self.steps) and all(s.has_solution for s in self.steps)

    @property
    def unsupported(self) -> str | None:
        """Why this task cannot run here at all (None: it can)."""
        if self.os != "linux":
            return f"needs a {self.os} container; sandboxes are Linux containers"
        if self.gpus > 0:
            return f"needs {self.gpus} GPU(s); sandboxes have none"
        if self.compose_file is not None:
            return (
                f"{self.compose_file.relative_to(self.path)} declares several containers: "
                "multi-container (docker-compose) tasks are not supported yet"
            )
        return None

    @property
    def slug(self) -> str:
        """Name usable in image tags and ids (lowercase, [a-z0-9._-])."""
        return re.sub(r"[^a-z0-9._-]+", "-", self.name.lower()).strip("-._") or "task"

    @property
    def built_tag(self) -> str:
        """Tag of the image built from environment/ (changes with its content)."""
        return f"stacx-task/{self.slug}:{_tree_digest(self.environment_dir)[:12]}"

    @property
    def image_tag(self) -> str:
        """Image for this task: `docker_image`, else the tag built from environment/."""
        return self.docker_image or self.built_tag

    def summary(self) -> dict[str, Any]:
        """The parsed fields that matter when running the task (for `stacx tasks check`)."""
        return {
            "steps": [s.name for s in self.steps] if self.multi_step else 1,
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "agent_timeout_s": self.agent_timeout_s,
            "verifier_timeout_s": self.verifier_timeout_s,
            "internet": self.wants_internet,
            "workdir": self.workdir,
            "docker_image": self.docker_image,
        }


def _tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    if directory.is_dir():
        for child in sorted(p for p in directory.rglob("*") if p.is_file()):
            digest.update(child.relative_to(directory).as_posix().encode() + b"\0")
            digest.update(child.read_bytes() + b"\0")
    return digest.hexdigest()


def _wants_internet(env: dict[str, Any], where: str) -> bool:
    mode = env.get("network_mode", env.get("network"))
    if mode is not None:
        text = str(mode).lower()
        if text not in _INTERNET_MODES | _OFFLINE_MODES:
            raise TaskFormatError(
                f"{where} network_mode must be one of no-network, public, allowlist, got {mode!r}"
            )
        return text in _INTERNET_MODES
    return bool(env.get("allow_internet", False))


def _read_toml(root: Path) -> dict[str, Any]:
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise TaskFormatError(f"{root} is not a Harbor task: task.toml is missing")
    try:
        return tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskFormatError(f"{toml_path}: invalid TOML ({exc})") from exc


def load_task(path: str | Path) -> HarborTask:
    """Load and validate one task directory; `TaskFormatError` names the file and field at fault."""
    root = Path(path).resolve()
    doc = _read_toml(root)
    where = str(root / "task.toml")
    task = _build(root, doc, where)
    _check_files(task)
    task.warnings += _warnings(task, doc)
    return task


def _build(root: Path, doc: dict[str, Any], where: str) -> HarborTask:
    meta, env = tc.table(doc, "task", where), tc.table(doc, "environment", where)
    verifier, agent = tc.table(doc, "verifier", where), tc.table(doc, "agent", where)
    task = HarborTask(
        name=str(meta.get("name") or root.name),
        path=root,
        instruction="",
        description=str(meta.get("description", "")),
        metadata=tc.table(doc, "metadata", where),
        schema_version=str(doc.get("schema_version", doc.get("version", "1.0"))),
        verifier_timeout_s=tc.positive(verifier, "timeout_sec", 600.0, f"{where} [verifier]") or 600.0,
        verifier_env=tc.string_map(verifier, "env", f"{where} [verifier]"),
        agent_timeout_s=tc.positive(agent, "timeout_sec", 600.0, f"{where} [agent]") or 600.0,
        solution_env=tc.string_map(tc.table(doc, "solution", where), "env", f"{where} [solution]"),
        env=tc.string_map(env, "env", f"{where} [environment]"),
        cpus=tc.positive(env, "cpus", 1.0, f"{where} [environment]") or 1.0,
        memory_mb=_memory_mb(env, f"{where} [environment]"),
        storage_mb=_storage_mb(env, f"{where} [environment]"),
        gpus=tc.count(env, "gpus", f"{where} [environment]"),
        build_timeout_s=tc.positive(env, "build_timeout_sec", 600.0, f"{where} [environment]") or 600.0,
        wants_internet=_wants_internet(env, f"{where} [environment]"),
        docker_image=str(env["docker_image"]) if env.get("docker_image") else None,
        os=str(env.get("os", "linux")).lower(),
        workdir=_workdir(env.get("workdir"), where),
        healthcheck=tc.healthcheck(env.get("healthcheck"), f"{where} [environment]"),
        mcp_servers=_mcp_servers(env.get("mcp_servers", []), where),
        skills_dir=str(env["skills_dir"]) if env.get("skills_dir") else None,
        artifacts=tc.artifacts(doc.get("artifacts", []), where),
        multi_step_reward_strategy=_strategy(doc.get("multi_step_reward_strategy"), where),
        compose_file=next(
            (root / "environment" / n for n in COMPOSE_FILES if (root / "environment" / n).is_file()), None
        ),
    )
    raw_steps = doc.get("steps")
    if raw_steps is not None:
        if not isinstance(raw_steps, list) or not raw_steps:
            raise TaskFormatError(f"{where}: [[steps]] must be a non-empty array of tables")
        configs = [tc.step(entry, where) for entry in raw_steps]
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise TaskFormatError(f"{where}: step names must be unique, got {names}")
        task.multi_step = True
        task.steps = [_step(root / "steps" / c.name, c, task) for c in configs]
    else:
        config = StepConfig(name=task.slug)
        task.steps = [_step(root, config, task)]
    task.instruction = task.steps[0].instruction
    return task


def _step(directory: Path, config: StepConfig, task: HarborTask) -> TaskStep:
    instruction = directory / "instruction.md"
    if not instruction.is_file():
        what = f"step {config.name!r}" if task.multi_step else "the agent"
        raise TaskFormatError(f"{directory}: instruction.md is missing (the instruction of {what})")
    return TaskStep(name=config.name, dir=directory, instruction=instruction.read_text(), config=config)


def _memory_mb(env: dict[str, Any], where: str) -> int:
    explicit = env.get("memory_mb")
    if "memory" in env:
        legacy = tc.parse_size_mb(env["memory"], f"{where} memory")
        if explicit is not None and tc.parse_size_mb(explicit, f"{where} memory_mb") != legacy:
            raise TaskFormatError(
                f"{where}: memory = {env['memory']!r} ({legacy} MB) and memory_mb = {explicit!r} "
                "disagree; keep only memory_mb"
            )
        return legacy
    return tc.parse_size_mb(explicit, f"{where} memory_mb") if explicit is not None else 2048


def _storage_mb(env: dict[str, Any], where: str) -> int | None:
    if "storage" in env:
        return tc.parse_size_mb(env["storage"], f"{where} storage")
    value = env.get("storage_mb")
    return tc.parse_size_mb(value, f"{where} storage_mb") if value is not None else None


def _workdir(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or ".." in value.split("/"):
        raise TaskFormatError(
            f"{where} [environment] workdir must be an absolute path without '..', got {value!r}"
        )
    return value


def _mcp_servers(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(s, dict) and s.get("name") for s in value):
        raise TaskFormatError(f'{where} [[environment.mcp_servers]] entries need name = "..."')
    return [dict(s) for s in value]


def _strategy(value: Any, where: str) -> str:
    if value is None:
        return "mean"
    if value not in ("mean", "final"):
        raise TaskFormatError(f"{where} multi_step_reward_strategy must be 'mean' or 'final', got {value!r}")
    return str(value)


def _check_files(task: HarborTask) -> None:
    for s in task.steps:
        if not (s.tests_dir / "test.sh").is_file() and not (task.tests_dir / "test.sh").is_file():
            where = f"{s.dir}/tests/test.sh or {task.tests_dir}/test.sh" if task.multi_step else s.tests_dir
            raise TaskFormatError(
                f"{task.path}: tests/test.sh is missing (the verifier entry point; looked for {where})"
            )
    if not task.docker_image and not task.dockerfile.is_file():
        raise TaskFormatError(
            f"{task.path}: environment/Dockerfile is missing (or set [environment] docker_image)"
        )


def _warnings(task: HarborTask, doc: dict[str, Any]) -> list[str]:
    notes = [f"unknown field {name} ignored" for name in tc.unknown_fields(doc)]
    env, verifier = doc.get("environment") or {}, doc.get("verifier") or {}
    if task.wants_internet:
        notes.append("asks for internet access; sandboxes have no network, it runs offline")
    if (
        env.get("allowed_hosts")
        or verifier.get("allowed_hosts")
        or (doc.get("agent") or {}).get("allowed_hosts")
    ):
        notes.append("allowed_hosts ignored: sandboxes have no network")
    if task.storage_mb is not None:
        notes.append(f"storage_mb = {task.storage_mb} is not enforced (no per-container disk quota)")
    if env.get("gpu_types") or env.get("tpu"):
        notes.append("gpu_types / tpu ignored: sandboxes have no accelerators")
    if task.mcp_servers:
        names = ", ".join(str(s["name"]) for s in task.mcp_servers)
        notes.append(
            f"mcp_servers ({names}) are listed in the task sample; "
            "the built-in scaffolds do not call MCP tools"
        )
    if task.skills_dir:
        notes.append(f"skills_dir {task.skills_dir} is not installed into agents")
    if task.artifacts or any(s.config.artifacts for s in task.steps):
        notes.append("artifacts are not collected")
    if any(k in verifier for k in ("environment_mode", "environment", "collect")):
        notes.append(
            "[verifier] environment_mode / environment / collect ignored: "
            "the verifier runs in the agent's sandbox"
        )
    users = [verifier.get("user"), (doc.get("agent") or {}).get("user")]
    users += [u for s in task.steps for u in (s.config.agent_user, s.config.verifier_user)]
    if any(u is not None for u in users):
        notes.append("agent/verifier user ignored: commands run as the image's user")
    if task.docker_image and task.dockerfile.is_file():
        notes.append(
            f"docker_image {task.docker_image} is used when present locally, "
            "else environment/Dockerfile is built"
        )
    return notes


def find_task_dirs(root: str | Path, *, max_depth: int = 3) -> list[Path]:
    """Every folder under `root` (or `root` itself) holding a task.toml, symlinks followed, sorted."""
    base = Path(root)
    if (base / "task.toml").is_file():
        return [base]
    if not base.is_dir():
        raise TaskFormatError(f"{base} is not a directory")
    found: list[Path] = []
    _walk(base, max_depth, found, seen=set())
    if not found:
        raise TaskFormatError(f"no task.toml under {base}")
    return sorted(found)


def _walk(directory: Path, depth: int, found: list[Path], *, seen: set[Path]) -> None:
    real = directory.resolve()
    if real in seen or depth < 0:
        return
    seen.add(real)
    if (directory / "task.toml").is_file():
        found.append(directory)
        return
    for child in sorted(directory.iterdir()):
        if child.is_dir() and not child.name.startswith("."):
            _walk(child, depth - 1, found, seen=seen)


def discover_tasks(root: str | Path, *, max_depth: int = 3) -> list[HarborTask]:
    """Every task under `root`, sorted by name; `TaskFormatError` lists every broken one at once.
    (`find_task_dirs` + `load_task` per folder reports each task on its own.)"""
    tasks, errors = [], []
    for directory in find_task_dirs(root, max_depth=max_depth):
        try:
            tasks.append(load_task(directory))
        except TaskFormatError as exc:
            errors.append(str(exc))
    if errors:
        raise TaskFormatError("; ".join(errors))
    return sorted(tasks, key=lambda t: t.name)


def to_task_sample(task: HarborTask) -> TaskSample:
    """The `TaskSample` a rollout worker needs to run `task` through the gateway."""
    data: dict[str, Any] = {
        "agent_timeout_s": task.agent_timeout_s,
        "verifier_timeout_s": task.verifier_timeout_s,
        "cpus": task.cpus,
        "memory_mb": task.memory_mb,
        "has_solution": task.has_solution,
    }
    if task.mcp_servers:
        data["mcp_servers"] = task.mcp_servers
    return TaskSample(
        task_id=task.slug,
        task_type=str(task.metadata.get("category") or "harbor"),
        prompt=task.instruction,
        data=json.dumps(data, sort_keys=True),
        task_dir=str(task.path),
        image=task.image_tag,
        metadata={str(k): v if isinstance(v, str) else json.dumps(v) for k, v in task.metadata.items()},
    )
