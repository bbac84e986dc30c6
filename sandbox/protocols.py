"""The seams of the sandbox package: what a backend implements and what a verifier needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from stacx.sandbox.models import ExecRequest, ExecResult

__all__ = ["HostCapacity", "SandboxBackend", "SandboxHandle", "SandboxOps", "SandboxSpec"]


@dataclass(frozen=True, slots=True)
class HostCapacity:
    """What the machine running the sandboxes has: the gateway's budget must fit in it."""

    cpus: float
    """Cores."""
    memory_mb: int
    """Physical memory."""
    pid_max: int | None
    """`/proc/sys/kernel/pid_max` (None: unknown, e.g. a remote Docker engine)."""


@dataclass(kw_only=True, slots=True)
class SandboxSpec:
    """A fully resolved request to start one sandbox (defaults applied, limits capped)."""

    session_id: str
    """Gateway session id; also labels the container."""
    owner: str
    """Name of the gateway deployment owning the sandbox (reaper label)."""
    instance: str
    """Id of the running gateway process (reaper label)."""
    image: str
    workdir: str
    """Writable working directory inside the sandbox."""
    seed_workdir: bool = False
    """Start the workdir with the image's content at that path (task images) instead of empty."""
    cpus: float
    memory_mb: int
    pids: int
    env: dict[str, str] = field(default_factory=dict)
    expires_at: float
    """Unix time after which any reaper may remove the sandbox."""
    harbor: bool = False
    """Harbor semantics: the image's user (root) and WORKDIR, a writable root file system, the
    capabilities package managers need, the image's ENTRYPOINT kept."""
    volumes: dict[str, str] = field(default_factory=dict)
    """Named volume -> mount point, mounted read-only (the offline verifier tools)."""


@dataclass(kw_only=True, slots=True)
class SandboxHandle:
    """A started sandbox, as its backend knows it."""

    session_id: str
    ref: str
    """Backend reference: container id, or the session's host directory."""
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    oom_kills: int = 0
    """Out-of-memory kills seen so far (to attribute new ones to an exec)."""
    notes: list[str] = field(default_factory=list)
    """What the backend had to change to start the sandbox (e.g. an ENTRYPOINT that exited)."""
    writable: dict[str, str] = field(default_factory=dict)
    """Every writable directory of the sandbox -> its octal mode at start, when the backend
    knows them all and they all started empty (what a reset restores); empty: unknown."""


@runtime_checkable
class SandboxBackend(Protocol):
    """Starts, drives and removes isolated sandboxes. Implementations: docker, process, fake."""

    name: str

    @property
    def problem(self) -> str | None:
        """Why the backend cannot serve sessions right now (e.g. a wedged engine), or None."""
        ...

    @property
    def capacity(self) -> HostCapacity:
        """The cores, memory and pid_max of the host the sandboxes run on."""
        ...

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        """Start a sandbox and return once it accepts execs."""
        ...

    async def exec(self, handle: SandboxHandle, request: ExecRequest, *, max_output_bytes: int) -> ExecResult:
        """Run `request.command` with `bash -c`; kill its process group at the timeout."""
        ...

    async def write_archive(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        """Extract a (validated) tar archive into directory `dest`, creating it."""
        ...

    async def read_file(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        """Bytes of a regular file; `SandboxFileNotFound` when it does not exist."""
        ...

    async def read_archive(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        """A tar archive of directory `path` (members relative to it)."""
        ...

    async def stop(self, handle: SandboxHandle) -> None:
        """Remove the sandbox and everything it wrote; idempotent."""
        ...

    async def reap(self, *, owner: str, keep: set[str]) -> int:
        """Remove `owner`'s sandboxes whose session id is not in `keep`, and any expired one."""
        ...

    async def image_workdir(self, image: str) -> str | None:
        """The image's WORKDIR when it has one (None: unknown or not applicable)."""
        ...

    async def close(self) -> None:
        """Release client resources (not the sandboxes: the session manager stops those)."""
        ...


@runtime_checkable
class SandboxOps(Protocol):
    """Session operations a verifier or agent needs; `SandboxClient` and `SessionManager` have them."""

    async def exec(
        self,
        session_id: str,
        command: str,
        *,
        timeout_s: float = 60.0,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult: ...

    async def upload_archive(self, session_id: str, dest: str, data: bytes) -> None: ...

    async def download(self, session_id: str, path: str) -> bytes: ...
