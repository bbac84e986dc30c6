"""Process backend for machines without Docker: every exec runs in a fresh bubblewrap sandbox.

A session is a host directory holding its workdir, /tests, /logs and /tmp. Each exec starts
`bwrap` with new user, pid, network, IPC, UTS and cgroup namespaces (so no network at all), the
host's /usr and /etc read-only, and only this session's directories writable and visible. The
command runs as a numeric non-root uid under `timeout -s KILL`; when it ends, the pid namespace
ends and takes every process it left with it. Limits: `ulimit -v` bounds memory; CPU and pids
are not limited (use the docker backend where that matters). The image is ignored.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from stacx.sandbox.backends._common import (
    READ_DIR_SCRIPT,
    READ_FILE_SCRIPT,
    TIMEOUT_GRACE_S,
    WRITE_ARCHIVE_SCRIPT,
    OutputCap,
    RawRun,
    check_helper,
    downloaded,
    exec_argv,
    helper_argv,
    local_capacity,
    to_result,
)
from stacx.sandbox.errors import BackendError
from stacx.sandbox.models import ExecRequest, ExecResult
from stacx.sandbox.protocols import HostCapacity, SandboxHandle, SandboxSpec

__all__ = ["ProcessBackend"]

_MOUNTS = ("tests", "logs", "tmp", "solution")
_META = "sandbox.json"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ProcessBackend:
    """Sandboxes as bubblewrap-isolated processes over per-session host directories."""

    name = "process"
    problem: str | None = None

    @dataclass(kw_only=True, slots=True)
    class Config:
        root: str = "/tmp/stacx-sandboxes"
        """Host directory holding one subdirectory per owner and session."""
        bwrap: str = "/usr/bin/bwrap"
        """bubblewrap executable."""
        uid: int = 1000
        """uid (and gid) commands run as inside the sandbox."""
        ro_binds: tuple[str, ...] = ("/usr", "/etc", "/opt")
        """Host directories visible read-only (those that exist)."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or ProcessBackend.Config()
        if not os.access(self.config.bwrap, os.X_OK):
            raise BackendError(
                f"bubblewrap not found at {self.config.bwrap}; install bubblewrap or set "
                "ProcessBackend.Config.bwrap"
            )
        self._memory: dict[str, int] = {}
        self.capacity: HostCapacity = local_capacity()
        """This machine: sandboxes are its processes."""

    def _dir(self, owner: str, session_id: str) -> Path:
        return Path(self.config.root) / owner / session_id

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        base = self._dir(spec.owner, spec.session_id)
        for sub in ("work", *_MOUNTS):
            (base / sub).mkdir(parents=True, exist_ok=True)
        meta = {"expires_at": spec.expires_at, "instance": spec.instance}
        (base / _META).write_text(json.dumps(meta))
        self._memory[str(base)] = spec.memory_mb
        env = {"HOME": spec.workdir, **spec.env}
        return SandboxHandle(session_id=spec.session_id, ref=str(base), workdir=spec.workdir, env=env)

    async def stop(self, handle: SandboxHandle) -> None:
        self._memory.pop(handle.ref, None)
        await asyncio.to_thread(_remove_session_dir, Path(handle.ref))

    async def reap(self, *, owner: str, keep: set[str]) -> int:
        return await asyncio.to_thread(self._reap, owner, keep)

    def _reap(self, owner: str, keep: set[str]) -> int:
        removed = 0
        root = Path(self.config.root)
        for base in root.glob("*/*"):
            if not (base / _META).exists():
                continue
            try:
                expires = float(json.loads((base / _META).read_text())["expires_at"])
            except (OSError, ValueError, KeyError):
                expires = 0.0
            orphan = base.parent.name == owner and base.name not in keep
            if orphan or expires < time.time():
                _remove_session_dir(base)
                removed += 1
        return removed

    async def image_workdir(self, image: str) -> str | None:
        return None

    async def close(self) -> None:
        return None

    # -- exec and files --------------------------------------------------------------------
    def _bwrap_argv(self, handle: SandboxHandle, workdir: str, env: dict[str, str]) -> list[str]:
        base = Path(handle.ref)
        argv = [self.config.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent"]
        argv += ["--new-session", "--uid", str(self.config.uid), "--gid", str(self.config.uid)]
        for path in self.config.ro_binds:
            if os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        for link in ("bin", "sbin", "lib", "lib64", "lib32"):
            if os.path.islink(f"/{link}"):
                argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(base / "work"), handle.workdir]
        for sub in _MOUNTS:
            argv += ["--bind", str(base / sub), f"/{sub}"]
        argv += ["--remount-ro", "/", "--clearenv", "--setenv", "PATH", _PATH, "--chdir", workdir]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--"]

    def _limits(self, handle: SandboxHandle) -> list[str]:
        kib = self._memory.get(handle.ref, 1024) * 1024
        return ["bash", "-c", f'ulimit -v {kib} && exec "$@"', "stacx"]

    async def exec(self, handle: SandboxHandle, request: ExecRequest, *, max_output_bytes: int) -> ExecResult:
        argv = self._bwrap_argv(handle, request.workdir or handle.workdir, {**handle.env, **request.env})
        argv += self._limits(handle) + exec_argv(request.command, request.timeout_s)
        stdin = request.stdin.encode() if request.stdin is not None else None
        run = await _run(argv, stdin, max_output_bytes, request.timeout_s + TIMEOUT_GRACE_S)
        return to_result(run, request.timeout_s)

    async def _helper(
        self, handle: SandboxHandle, argv: list[str], stdin: bytes | None, limit: int
    ) -> RawRun:
        full = self._bwrap_argv(handle, "/", handle.env) + argv
        return await _run(full, stdin, limit, 300.0)

    async def write_archive(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        run = await self._helper(handle, helper_argv(WRITE_ARCHIVE_SCRIPT, dest), data, 1 << 16)
        check_helper(run, "directory", dest)

    async def read_file(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        run = await self._helper(handle, helper_argv(READ_FILE_SCRIPT, path), None, max_bytes)
        return downloaded(run, "file", path, max_bytes)

    async def read_archive(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        run = await self._helper(handle, helper_argv(READ_DIR_SCRIPT, path), None, max_bytes)
        return downloaded(run, "directory", path, max_bytes)


async def _run(argv: list[str], stdin: bytes | None, max_bytes: int, wait_s: float) -> RawRun:
    """Run argv in its own process group; kill the group if it outlives `wait_s`."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = OutputCap(max_bytes), OutputCap(max_bytes)
    host_timeout = False
    try:
        await asyncio.wait_for(_communicate(proc, stdin, out, err), wait_s)
    except TimeoutError:
        host_timeout = True
    finally:
        if proc.returncode is None:
            _kill_group(proc.pid)
            await proc.wait()
    code = proc.returncode if proc.returncode is not None else 137
    exit_code = 128 - code if code < 0 else code
    return RawRun(
        exit_code=137 if host_timeout else exit_code,
        stdout=out,
        stderr=err,
        duration_s=time.monotonic() - started,
        host_timeout=host_timeout,
    )


async def _communicate(
    proc: asyncio.subprocess.Process, stdin: bytes | None, out: OutputCap, err: OutputCap
) -> None:
    async def pump(stream: asyncio.StreamReader | None, cap: OutputCap) -> None:
        assert stream is not None
        while chunk := await stream.read(1 << 16):
            cap.add(chunk)

    async def feed() -> None:
        if proc.stdin is None or stdin is None:
            return
        try:
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            proc.stdin.close()

    await asyncio.gather(feed(), pump(proc.stdout, out), pump(proc.stderr, err))
    await proc.wait()


def _remove_session_dir(base: Path) -> None:
    """Remove a session directory, and its owner directory once that is empty."""
    shutil.rmtree(base, ignore_errors=True)
    try:
        base.parent.rmdir()
    except OSError:
        pass  # other sessions of this owner remain


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
