"""The adapter interface of black-box scaffolds, and their registry.

A black-box scaffold is a third-party agent (mini-swe-agent, Terminus-2, ...) that runs as its own
process for one episode. The engine gives it an `EpisodeSpec` (a JSON file named by the
`STACX_EPISODE` environment variable): the task, the model's OpenAI `base_url` (the agent proxy,
under a per-episode path, so every model call is captured), and the sandbox session to run shell
commands in (through the gateway). It writes its outcome as JSON to `spec.result_path`.

Adding a scaffold is one small file: a subclass of `ExternalScaffold` naming the PyPI packages of
its virtual environment and the driver script that translates the spec into the scaffold's own
API, decorated with `@register`. Name it in the rollout YAML as `scaffold: <name>`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stacx.rollout.errors import ConfigError
from stacx.rollout.protocols import Action, ExecResult, Message, Observation
from stacx.schemas.plugins import PluginError, Registry, import_object
from stacx.schemas.records import TaskSample

__all__ = [
    "DRIVERS",
    "EXTERNAL_SCAFFOLDS",
    "EpisodeSpec",
    "ExternalScaffold",
    "build_external",
    "is_external",
    "register",
]

DRIVERS = Path(__file__).resolve().parent / "drivers"
"""Driver scripts: they run in the scaffold's interpreter and import nothing of ours."""


@dataclass(kw_only=True, slots=True)
class EpisodeSpec:
    """What a scaffold process is told about its episode (written as JSON, read by the driver)."""

    episode_id: str
    task_id: str
    instruction: str
    """The task's prompt (Harbor: instruction.md)."""
    model_base_url: str
    """OpenAI-compatible base URL ending in /v1: the agent proxy under this episode's path."""
    model_name: str
    api_key: str = "stacx"
    gateway_url: str = ""
    """Sandbox gateway base URL ('' when the scaffold has no sandbox)."""
    gateway_token: str = ""
    sandbox_session: str = ""
    """Gateway session id of this episode's sandbox."""
    max_turns: int = 8
    max_new_tokens: int = 256
    temperature: float = 1.0
    step_timeout_s: float = 60.0
    result_path: str = ""
    """Where the driver writes its outcome JSON (`{"exit_status": ..., ...}`)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The adapter's own options (`scaffold_options` in the YAML)."""

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))


@dataclass(kw_only=True, slots=True)
class ExternalScaffold:
    """Base of every black-box scaffold adapter (see the module docstring)."""

    name: str = ""
    """Name used in the rollout YAML."""
    requirements: tuple[str, ...] = ()
    """pip requirement lines of its own virtual environment; empty: run with our interpreter."""
    python: str = ""
    """Minimum Python of that environment, e.g. "3.12" ('' = ours)."""
    driver: str = ""
    """Driver script: a file name in `rollout/blackbox/drivers/`, or an absolute path."""
    needs_sandbox: bool = True
    stop: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    """`scaffold_options` of the YAML, handed to the driver as `spec.options`."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the scaffold process (over the engine's own)."""

    def __post_init__(self) -> None:
        if not self.driver_path().is_file():
            raise ConfigError(f"scaffold {self.name!r}: driver {self.driver!r} is not a file in {DRIVERS}")

    def driver_path(self) -> Path:
        return DRIVERS / self.driver  # an absolute `driver` wins the join

    # The `Scaffold` side the engine sees: a black-box scaffold reads its own model output.
    def initial_messages(self, task: TaskSample) -> list[Message]:
        return [{"role": "user", "content": task.prompt}]

    def parse(self, text: str, *, finish_reason: str) -> Action:
        return Action(kind="invalid", reason="a black-box scaffold parses its own output")

    def observe(self, action: Action, result: ExecResult) -> Observation:
        return Observation(text="")

    def first_messages(self, instruction: str) -> list[Message]:
        """The chat messages of the scaffold's first model call for a task with `instruction`:
        what SFT transcripts are rendered from (`stacx.rollout.blackbox.transcripts`). Adapters that
        know their prompt templates override it."""
        raise ConfigError(
            f"scaffold {self.name!r} does not say what its first model call looks like, so "
            "transcripts cannot be rendered for it; use a scaffold whose adapter has first_messages"
        )

    def argv(self, python: str, spec_path: Path) -> list[str]:
        """The command that runs one episode (the spec path also travels as STACX_EPISODE)."""
        return [python, str(self.driver_path()), str(spec_path)]


def _load_builtin() -> None:
    import stacx.rollout.blackbox.scaffolds  # noqa: F401  (registers the shipped adapters)


def _check(cls: Any) -> str | None:
    if not (isinstance(cls, type) and issubclass(cls, ExternalScaffold)):
        return f"{cls!r} is not a subclass of stacx.rollout.blackbox.ExternalScaffold"
    return None


EXTERNAL_SCAFFOLDS: Registry[type[ExternalScaffold]] = Registry(
    "blackbox_scaffolds", what="black-box scaffold adapter", check=_check, load_builtin=_load_builtin
)
"""Adapters of black-box scaffolds (a process per episode, its model calls captured by the proxy)."""

_S = TypeVar("_S", bound=type[ExternalScaffold])


def register(name: str) -> Callable[[_S], _S]:
    """Class decorator: make an adapter available as `scaffold: <name>`."""

    def add(cls: _S) -> _S:
        EXTERNAL_SCAFFOLDS.add(name, cls, origin=_origin(cls))
        return cls

    return add


def _origin(cls: type) -> str:
    shipped = cls.__module__.startswith("stacx.rollout.blackbox.scaffolds")
    return f"{'builtin' if shipped else 'registered'} ({cls.__module__})"


def is_external(ref: str) -> bool:
    """True when `ref` names a black-box adapter (a registered name, or a dotted path to a
    subclass of `ExternalScaffold`)."""
    if ":" in ref:
        try:
            return _check(import_object(ref)) is None
        except PluginError:
            return False  # the scaffold registry reports the failure
    return ref in EXTERNAL_SCAFFOLDS


def build_external(ref: str, options: dict[str, Any]) -> ExternalScaffold:
    """The adapter `ref` names, with its options."""
    try:
        cls = EXTERNAL_SCAFFOLDS.resolve(ref)
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    return cls(name=ref, options=dict(options))
