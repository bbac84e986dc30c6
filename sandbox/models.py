"""Wire models of the gateway API, shared by the server, the client and the backends."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "DEFAULT_WORKDIR",
    "ExecRequest",
    "ExecResult",
    "FileWritten",
    "Health",
    "SessionInfo",
    "SessionSpec",
    "VerifyResult",
]

DEFAULT_WORKDIR = "/workspace"
"""Writable working directory of a sandbox built from a plain image."""


class _Model(BaseModel):
    """A wire model: unknown fields, NaN/Infinity and lone UTF-16 surrogates are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = _surrogate_at(data, "")
        if where is not None:
            raise ValueError(
                f"{where or 'body'} holds a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode"
            )
        return data


def _surrogate_at(data: Any, path: str) -> str | None:
    """The path of the first string (or key) holding a lone surrogate; None if none does
    (iterative: a body nested 1,000 deep must not exhaust the stack)."""
    stack = [(path, data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            for key, value in item.items():
                name = f"{where}.{key}".lstrip(".")
                stack += [(name, key), (name, value)]
        elif isinstance(item, list):
            stack += [(f"{where}[{i}]", value) for i, value in enumerate(item)]
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_env(env: dict[str, str]) -> dict[str, str]:
    """Names a process environment can hold: not empty, no `=` and no NUL; values without NUL."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"env name {name!r} must be non-empty without '=' or NUL characters")
        if "\0" in value:
            raise ValueError(f"env value of {name!r} holds a NUL character, which no environment can")
    return env


class SessionSpec(_Model):
    """What to start: an image or a Harbor task directory, plus limits. Unset limits take defaults."""

    image: str | None = None
    """Image to run (e.g. `stacx/sandbox:bookworm`); exclusive with `task_dir`."""
    task_dir: str | None = None
    """Harbor task directory on the gateway host: its image is built (cached) and its limits used."""
    cpus: float | None = Field(default=None, gt=0, le=64)
    """CPU quota in cores."""
    memory_mb: int | None = Field(default=None, ge=16, le=1 << 20)
    """Memory limit (swap included)."""
    pids: int | None = Field(default=None, ge=8, le=1 << 16)
    """Maximum number of processes and threads."""
    lifetime_s: float | None = Field(default=None, gt=0)
    """Hard maximum lifetime; capped by the gateway's maximum."""
    idle_timeout_s: float | None = Field(default=None, gt=0)
    """Close the session after this long without a request."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of every exec."""
    network: Literal["none"] = "none"
    """Network policy; only `none` (no interface but loopback) is supported."""
    workdir: str | None = None
    """Writable working directory (default: the task image's WORKDIR, else /workspace)."""

    @field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_env(value)

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ".." in value.split("/")):
            raise ValueError(f"workdir must be an absolute path without '..', got {value!r}")
        return value


class SessionInfo(_Model):
    """A live session as the gateway reports it."""

    id: str
    image: str
    backend: str
    workdir: str
    cpus: float
    memory_mb: int
    pids: int
    network: str
    created_at: float
    """Unix time (s)."""
    expires_at: float
    """Unix time (s) of the hard lifetime limit."""
    idle_timeout_s: float
    last_used_at: float
    task_name: str | None = None
    harbor: bool = False
    """Harbor semantics (task sessions): the image's user and WORKDIR, writable root file system."""
    warnings: list[str] = Field(default_factory=list)
    """What the session could not honour or had to substitute (one line each)."""


class ExecRequest(_Model):
    """One command, run with `bash -c` as the sandbox user."""

    command: str = Field(min_length=1)
    timeout_s: float = Field(default=60.0, gt=0, le=24 * 3600)
    """Wall-clock limit; at expiry the command's whole process group is killed, and (docker backend)
    every process it started that left the group."""
    stdin: str | None = None
    """Text fed to the command's standard input (none: /dev/null)."""
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    """Directory to run in (default: the session's workdir)."""
    max_output_bytes: int | None = Field(default=None, ge=0)
    """Per-stream cap (bytes) below the gateway's own; longer output is cut and flagged."""

    @field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_env(value)

    @field_validator("command", "workdir")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:
            raise ValueError("holds a NUL character, which no command line or path can")
        return value


class ExecResult(_Model):
    """What a command did."""

    exit_code: int
    """Exit status; 128+N when killed by signal N (137: SIGKILL)."""
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    """Killed at its exec timeout."""
    oom_killed: bool = False
    """A process of this exec was killed by the out-of-memory killer."""
    duration_s: float
    left_running: list[str] = Field(default_factory=list)
    """Processes this exec started that left its process group (`setsid`, a daemon's double fork)
    and still run after it ended on its own, `PID COMMAND` each (docker backend). They run on until
    the session ends or its sandbox is reset; an exec that is killed (timeout, out of memory,
    cancelled) takes them with it."""

    @property
    def truncated(self) -> bool:
        """Either stream was cut at the output cap."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        """Exit status 0."""
        return self.exit_code == 0


class FileWritten(_Model):
    """Answer to an upload."""

    path: str
    size: int


class Health(_Model):
    """Answer of /healthz."""

    status: str
    """`ok`, or `degraded` when the backend cannot start sessions (see `problem`)."""
    backend: str
    sessions: int
    version: str
    problem: str | None = None
    """Why the backend is degraded (e.g. the Docker engine is wedged), with the fix."""


class VerifyResult(_Model):
    """Outcome of a Harbor verifier run."""

    reward: float
    """The scalar reward: `reward` key of reward.json, its only value, or the mean of its values."""
    rewards: dict[str, float]
    """Every number of reward.json (`{"reward": x}` for reward.txt)."""
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    step: str | None = None
    """Step of a multi-step task this verification belongs to."""
