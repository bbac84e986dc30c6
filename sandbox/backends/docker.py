"""Docker backend: one hardened container per session, driven through the Docker SDK.

Every container runs with no network, all capabilities dropped, no-new-privileges, a read-only
root file system, a non-root numeric user, pids / memory / CPU limits, and writable tmpfs mounts
for /tmp, /tests and /logs. The workdir is a tmpfs, or, for task images whose WORKDIR it is, an
anonymous volume seeded from the image. Labels name the owner, the gateway instance, the session
and the expiry time so a reaper can always find what a crashed gateway left behind.

The SDK is blocking; exec and file calls run on a thread pool sized for hundreds of sessions, while
container create, start and remove go through a `LifecycleGuard`: a few at a time (Docker 20.10's
libnetwork deadlocks under many concurrent starts), and a call that hangs marks the engine wedged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import struct
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stacx.sandbox.backends._common import (
    KILL_MARKED_SCRIPT,
    LIST_MARKED_SCRIPT,
    OOM_EVENTS_SCRIPT,
    READ_DIR_SCRIPT,
    READ_FILE_SCRIPT,
    RESET_SCRIPT,
    TIMEOUT_GRACE_S,
    WRITE_ARCHIVE_SCRIPT,
    OutputCap,
    RawRun,
    check_helper,
    cut_left_running,
    downloaded,
    helper_argv,
    local_pid_max,
    parse_left_running,
    parse_oom_kills,
    to_result,
    tracked_exec_argv,
)
from stacx.sandbox.backends.lifecycle import LifecycleGuard
from stacx.sandbox.errors import BackendError, BaseImageMissing, PathRejected, SandboxStopped
from stacx.sandbox.library_patches import exec_reader, exec_socket
from stacx.sandbox.models import ExecRequest, ExecResult
from stacx.sandbox.protocols import HostCapacity, SandboxHandle, SandboxSpec

__all__ = ["LABEL_EXPIRES", "LABEL_INSTANCE", "LABEL_OWNER", "LABEL_SESSION", "DockerBackend"]

LABEL_SANDBOX = "stacx.sandbox"
LABEL_OWNER = "stacx.sandbox.owner"
LABEL_INSTANCE = "stacx.sandbox.instance"
LABEL_SESSION = "stacx.sandbox.session"
LABEL_EXPIRES = "stacx.sandbox.expires-at"
_KEEPALIVE = "trap 'exit 0' TERM; while :; do sleep 86400 & wait $!; done"
"""PID 1 of a sandbox: bash reaps the orphans that killed exec process groups leave behind."""

HARBOR_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE")
"""Capabilities Harbor sandboxes keep (root in the container): what apt/dpkg and pip need to own,
chmod and switch users, and binding low ports on the sandbox's own loopback. All others dropped."""
_TMPFS_ROOTS = ("/tmp", "/tests", "/logs", "/solution")
"""Writable tmpfs mounts of every sandbox (plus its workdir unless seeded from the image)."""
_TMPFS_MODE = "755"
"""Octal mode of each tmpfs mount at start (what a reset gives back)."""
_PF_EXITING = 0x4
"""Flag (/proc/PID/stat field 9) of a process that is exiting."""
_ENTRYPOINT_WAIT_S = 1.0
"""How long a started sandbox whose image has an ENTRYPOINT is watched for an early exit."""

T = TypeVar("T")
log = logging.getLogger(__name__)

WEDGED_HINT = (
    " Docker 20.10 can deadlock in libnetwork under many concurrent container starts (docs/infra.md)."
    " Fix: restart the engine (`stacx infra up` restarts a dockerd it started; a goroutine dump for a"
    " bug report: `kill -USR1 <dockerd pid>`), then retry."
)


class DockerBackend:
    """Sandboxes as hardened Docker containers."""

    name = "docker"

    @dataclass(kw_only=True, slots=True)
    class Config:
        base_url: str | None = None
        """Docker engine address (None: DOCKER_HOST or the local socket)."""
        user: str = "1000:1000"
        """Numeric uid:gid every sandbox process runs as."""
        tmpfs_mb: int = 256
        """Size of each tmpfs mount (/tmp, /tests, /logs, a fresh workdir), at most half the
        session's memory limit; their files count as memory."""
        max_threads: int = 512
        """Thread pool (and HTTP connection pool) size for concurrent exec and file calls."""
        lifecycle_concurrency: int = 4
        """Container create/start/remove calls in flight at once (bench/sandbox.py measures it)."""
        lifecycle_stuck_s: float = 60.0
        """A lifecycle call running longer than this marks the engine wedged (gateway answers 503)."""
        api_timeout_s: float = 120.0
        """Timeout of one engine API call."""

    def __init__(self, config: Config | None = None) -> None:
        import docker

        self.config = config or DockerBackend.Config()
        kwargs: dict[str, Any] = {
            "timeout": int(self.config.api_timeout_s),
            "max_pool_size": self.config.max_threads,
        }
        try:
            if self.config.base_url:
                self._client = docker.DockerClient(base_url=self.config.base_url, **kwargs)
            else:
                self._client = docker.from_env(**kwargs)
            info = self._client.info()
        except docker.errors.DockerException as exc:
            raise BackendError(f"no Docker engine answers ({exc}); start dockerd") from exc
        self._ncpu = float(info.get("NCPU", 1))
        self._local = _engine_is_local(self.config.base_url)
        self.capacity = HostCapacity(
            cpus=self._ncpu,
            memory_mb=int(info.get("MemTotal", 0)) // (1 << 20),
            pid_max=local_pid_max() if self._local else None,
        )
        """The engine's host (its pid_max is read only when the engine runs on this machine)."""
        self._pool = ThreadPoolExecutor(self.config.max_threads, thread_name_prefix="docker")
        self.lifecycle = LifecycleGuard(
            engine=self.config.base_url or "the local socket",
            concurrency=self.config.lifecycle_concurrency,
            stuck_after_s=self.config.lifecycle_stuck_s,
            probe=self._client.info,
            hint=WEDGED_HINT,
        )
        self._workdirs: dict[str, str | None] = {}
        self._pending_notes: dict[str, list[str]] = {}
        self._seed_modes: dict[str, str | None] = {}
        """Image -> mode of its WORKDIR when that directory is empty (None: it has content)."""

    @property
    def problem(self) -> str | None:
        """Why the engine cannot serve sessions now (wedged), or None."""
        return self.lifecycle.problem

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        what = f"create and start a container from {spec.image}"
        container_id = await self.lifecycle.run(what, self._start, spec, undo=self._remove)
        handle = SandboxHandle(
            session_id=spec.session_id,
            ref=container_id,
            workdir=spec.workdir,
            env=dict(spec.env),
            notes=self._pending_notes.pop(spec.session_id, []),
        )
        handle.writable = await self._writable(handle, spec)
        return handle

    async def _writable(self, handle: SandboxHandle, spec: SandboxSpec) -> dict[str, str]:
        """The sandbox's writable directories and their modes, when a reset can restore them:
        a plain sandbox's tmpfs mounts (a seeded workdir too when the image's is empty)."""
        if spec.harbor or spec.volumes:
            return {}  # a writable root file system: only a new container is as good as new
        writable = dict.fromkeys(_TMPFS_ROOTS, _TMPFS_MODE)
        if not spec.seed_workdir:
            return writable | {spec.workdir: _TMPFS_MODE}
        if spec.image not in self._seed_modes:  # once per image: is its WORKDIR empty?
            script = '[ -z "$(ls -A -- "$1")" ] && stat -c %a -- "$1"'
            argv = helper_argv(script, spec.workdir)
            try:
                run = await self._run(self._exec, handle.ref, argv, None, {}, "/", 1 << 10, 30.0)
            except (BackendError, SandboxStopped):
                return {}  # the session's own calls will say what is wrong
            mode = run.stdout.text().strip()
            self._seed_modes[spec.image] = mode if run.exit_code == 0 and mode.isdigit() else None
        seed_mode = self._seed_modes[spec.image]
        return writable | {spec.workdir: seed_mode} if seed_mode else {}

    def _start(self, spec: SandboxSpec) -> str:
        import docker.errors
        import requests

        try:
            container = self._client.containers.create(**self._create_kwargs(spec))
        except docker.errors.ImageNotFound as exc:  # the engine's errors are RequestExceptions too
            raise BaseImageMissing(
                f"image {spec.image!r} is not available locally; build it first "
                "(`stacx infra up` builds stacx/sandbox:bookworm)"
            ) from exc
        except docker.errors.APIError as exc:
            raise BackendError(f"creating a container from {spec.image!r} failed: {exc}") from exc
        except requests.exceptions.RequestException as exc:
            raise BackendError(f"creating a container from {spec.image!r}: no answer ({exc})") from exc
        try:
            container.start()
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            self._remove(container.id)
            raise BackendError(f"starting a container from {spec.image!r} failed: {exc}") from exc
        if spec.harbor:
            return self._running_despite_entrypoint(container, spec)
        return str(container.id)

    def _running_despite_entrypoint(self, container: Any, spec: SandboxSpec) -> str:
        """Harbor keeps the image's ENTRYPOINT (it gets the keep-alive command as arguments). One
        that exits instead of exec-ing them leaves no sandbox: start again without it, and say so."""
        entrypoint = (self._client.images.get(spec.image).attrs.get("Config") or {}).get("Entrypoint")
        if not entrypoint:
            return str(container.id)
        deadline = time.monotonic() + _ENTRYPOINT_WAIT_S
        while time.monotonic() < deadline:
            container.reload()
            if container.status != "running":
                break
            time.sleep(0.1)
        else:
            return str(container.id)
        logs = container.logs(tail=5).decode(errors="replace").strip()
        self._remove(container.id)
        self._pending_notes[spec.session_id] = [
            f"the image's ENTRYPOINT {entrypoint} exited at start ({logs[-200:]!r}) instead of "
            'running its arguments (`exec "$@"`); the sandbox runs without it'
        ]
        kwargs = self._create_kwargs(spec) | {"entrypoint": ["bash"], "command": ["-c", _KEEPALIVE]}
        retry = self._client.containers.create(**kwargs)
        retry.start()
        return str(retry.id)

    def _create_kwargs(self, spec: SandboxSpec) -> dict[str, Any]:
        from docker.types import Mount

        uid, _, gid = self.config.user.partition(":")
        # Each tmpfs at most half the memory limit (tmpfs pages count as memory and cannot be
        # reclaimed): filling /tmp ends in ENOSPC, not in an OOM kill of the whole sandbox.
        size_mb = max(8, min(self.config.tmpfs_mb, spec.memory_mb // 2))
        # Owned by the sandbox user: Docker drops a tmpfs `mode=1777`; `exec` undoes its noexec.
        options = f"rw,exec,nosuid,nodev,size={size_mb}m,mode=0{_TMPFS_MODE},uid={uid},gid={gid or uid}"
        roots = list(_TMPFS_ROOTS)
        mounts = []
        if spec.seed_workdir:
            mounts.append(Mount(target=spec.workdir, source=None, type="volume"))
        else:
            roots.append(spec.workdir)
        tmpfs = dict.fromkeys(roots, options)
        kwargs = {
            "image": spec.image,
            "command": ["bash", "-c", _KEEPALIVE],
            "user": self.config.user,
            "network_mode": "none",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
            "read_only": True,
            "pids_limit": spec.pids,
            "mem_limit": f"{spec.memory_mb}m",
            "memswap_limit": f"{spec.memory_mb}m",
            "nano_cpus": int(min(spec.cpus, self._ncpu) * 1e9),
            "tmpfs": tmpfs,
            "mounts": mounts,
            "working_dir": spec.workdir,
            "environment": {"HOME": spec.workdir, **spec.env},
            "hostname": "sandbox",
            "labels": {
                LABEL_SANDBOX: "1",
                LABEL_OWNER: spec.owner,
                LABEL_INSTANCE: spec.instance,
                LABEL_SESSION: spec.session_id,
                LABEL_EXPIRES: f"{spec.expires_at:.0f}",
            },
            "stop_signal": "SIGKILL",
        }
        return _harbor_kwargs(kwargs, spec) if spec.harbor else kwargs

    async def stop(self, handle: SandboxHandle) -> None:
        await self.lifecycle.run(f"remove container {handle.ref[:12]}", self._remove, handle.ref)

    def _remove(self, container_id: str) -> None:
        import docker.errors
        import requests

        try:
            self._client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # before RequestException: an APIError is one too
            if "already in progress" not in str(exc):
                raise BackendError(f"removing container {container_id[:12]} failed: {exc}") from exc
        except requests.exceptions.RequestException as exc:
            raise BackendError(f"removing container {container_id[:12]}: no answer ({exc})") from exc

    async def reap(self, *, owner: str, keep: set[str]) -> int:
        return await self.lifecycle.run(f"reap the containers of {owner}", self._reap, owner, keep)

    def _reap(self, owner: str, keep: set[str]) -> int:
        now = time.time()
        doomed: list[str] = []
        for info in self._client.api.containers(all=True, filters={"label": LABEL_SANDBOX}):
            labels = info.get("Labels") or {}
            expires = float(labels.get(LABEL_EXPIRES, "inf") or "inf")
            orphan = labels.get(LABEL_OWNER) == owner and labels.get(LABEL_SESSION) not in keep
            if orphan or expires < now:
                doomed.append(info["Id"])
        for container_id in doomed:
            self._remove(container_id)
        return len(doomed)

    async def image_workdir(self, image: str) -> str | None:
        if image not in self._workdirs:
            self._workdirs[image] = await self._run(self._image_workdir, image)
        return self._workdirs[image]

    def _image_workdir(self, image: str) -> str | None:
        import docker.errors

        try:
            attrs = self._client.images.get(image).attrs
        except docker.errors.ImageNotFound as exc:
            raise BaseImageMissing(
                f"image {image!r} is not available locally; build it first "
                "(`stacx infra up` builds stacx/sandbox:bookworm)"
            ) from exc
        return (attrs.get("Config") or {}).get("WorkingDir") or None

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.lifecycle.close()
        self._client.close()

    # -- exec and files --------------------------------------------------------------------
    async def exec(self, handle: SandboxHandle, request: ExecRequest, *, max_output_bytes: int) -> ExecResult:
        stdin = request.stdin.encode() if request.stdin is not None else None
        mark = uuid.uuid4().hex
        try:
            run = await self._run(
                self._exec,
                handle.ref,
                tracked_exec_argv(request.command, request.timeout_s, mark),
                stdin,
                {**handle.env, **request.env},
                request.workdir or handle.workdir,
                max_output_bytes,
                request.timeout_s + TIMEOUT_GRACE_S,
            )
        except asyncio.CancelledError:  # the caller gave up: nothing the exec started stays
            await asyncio.shield(self._kill_marked(handle, mark))
            raise
        if run.host_timeout:
            await self._kill_marked(handle, mark)
        if run.exit_code >= 126:  # 126/137 also when the container itself died during the exec
            await self._run(self._check_running, handle.ref)
        if run.exit_code == 126:
            _check_started(run, request.workdir or handle.workdir)
        oom = run.exit_code == 137 and await self._new_oom_kill(handle)
        left_running = [] if run.exit_code == 137 else await self._left_running(handle, run, mark)
        return to_result(run, request.timeout_s, oom_killed=oom, left_running=left_running)

    async def _left_running(self, handle: SandboxHandle, run: RawRun, mark: str) -> list[str]:
        """The exec's processes that left its process group and still run: from the list at the
        end of its stderr, or asked again when the output cap cut that list off."""
        listed = cut_left_running(run.stderr)
        if listed is not None:
            return listed
        argv = helper_argv(LIST_MARKED_SCRIPT, mark)
        try:
            again = await self._run(self._exec, handle.ref, argv, None, {}, "/", 1 << 16, 30.0)
        except (BackendError, SandboxStopped):
            return []
        return parse_left_running(again.stdout.text())

    async def _kill_marked(self, handle: SandboxHandle, mark: str) -> None:
        """Kill every process of the exec marked `mark` (its own timeout did not end it)."""
        argv = helper_argv(KILL_MARKED_SCRIPT, mark)
        try:
            run = await self._run(self._exec, handle.ref, argv, None, {}, "/", 1 << 16, 30.0)
        except (BackendError, SandboxStopped) as exc:
            log.warning("ending the processes of an exec in sandbox %s failed: %s", handle.ref[:12], exc)
            return
        if run.exit_code != 0:
            log.warning("processes of an exec in sandbox %s survive kill -9", handle.ref[:12])

    def _check_running(self, container_id: str) -> None:
        """Raise `SandboxStopped` saying why when the sandbox's container is no longer running."""
        import docker.errors

        try:
            state = self._client.api.inspect_container(container_id).get("State") or {}
        except docker.errors.NotFound as exc:
            raise SandboxStopped(f"container {container_id[:12]} is gone (removed)") from exc
        if state.get("Running") and self._init_alive(state.get("Pid")):
            return
        if state.get("OOMKilled"):
            why = "killed by the out-of-memory killer (memory_mb counts the files in its tmpfs mounts)"
        elif state.get("Running"):  # the engine records the exit a moment after the processes died
            why = "its main process was killed"
        else:
            why = f"its main process exited with {state.get('ExitCode')} {state.get('Error') or ''}".strip()
        raise SandboxStopped(
            f"the sandbox's container {container_id[:12]} died: {why}; close the session and start a new one"
        )

    def _init_alive(self, pid: int | None) -> bool:
        """Whether the container's PID 1 still lives, seen from the host when the engine is local
        (it marks a killed container exited only a moment after its processes are gone)."""
        if not pid or not self._local:
            return True
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return False
        exiting = int(fields[6]) & _PF_EXITING  # a dying init first kills the rest of its namespace
        return fields[0] not in ("Z", "X") and not exiting

    async def reset(self, handle: SandboxHandle) -> bool:
        """Kill every process but init and empty the tmpfs mounts (the only writable places of a
        plain sandbox: its root file system is read-only); False when anything survives."""
        if not handle.writable:
            return False
        argv = helper_argv(RESET_SCRIPT, *(f"{mode}:{path}" for path, mode in handle.writable.items()))
        try:
            run = await self._run(self._exec, handle.ref, argv, None, {}, "/", 1 << 16, 30.0)
        except (BackendError, SandboxStopped) as exc:
            log.warning("resetting sandbox %s failed: %s", handle.ref[:12], exc)
            return False
        if run.exit_code != 0:
            log.warning("resetting sandbox %s failed: %s", handle.ref[:12], run.stderr.text().strip()[-300:])
            return False
        return True

    async def _new_oom_kill(self, handle: SandboxHandle) -> bool:
        argv = ["bash", "-c", OOM_EVENTS_SCRIPT]
        run = await self._run(self._exec, handle.ref, argv, None, {}, "/", 1 << 16, 30.0)
        count = parse_oom_kills(run.stdout.text())
        seen, handle.oom_kills = handle.oom_kills, max(count, handle.oom_kills)
        return count > seen

    async def write_archive(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        argv = helper_argv(WRITE_ARCHIVE_SCRIPT, dest)
        run = await self._run(self._exec, handle.ref, argv, data, {}, "/", 1 << 16, 300.0)
        check_helper(run, "directory", dest)

    async def read_file(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        argv = helper_argv(READ_FILE_SCRIPT, path)
        run = await self._run(self._exec, handle.ref, argv, None, {}, "/", max_bytes, 300.0)
        return downloaded(run, "file", path, max_bytes)

    async def read_archive(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        argv = helper_argv(READ_DIR_SCRIPT, path)
        run = await self._run(self._exec, handle.ref, argv, None, {}, "/", max_bytes, 300.0)
        return downloaded(run, "directory", path, max_bytes)

    def _exec(
        self,
        container_id: str,
        argv: list[str],
        stdin: bytes | None,
        env: dict[str, str],
        workdir: str,
        max_bytes: int,
        wait_s: float,
    ) -> RawRun:
        import docker.errors

        started = time.monotonic()
        api = self._client.api
        try:
            exec_id = api.exec_create(
                container_id, argv, stdin=stdin is not None, environment=env, workdir=workdir
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.NotFound as exc:
            raise BackendError(f"container {container_id[:12]} is gone: {exc}") from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise SandboxStopped(
                    f"container {container_id[:12]} is not running (its ENTRYPOINT or main process "
                    f"exited): {exc.explanation or exc}"
                ) from exc
            raise BackendError(f"exec in container {container_id[:12]} failed: {exc}") from exc
        out, err = OutputCap(max_bytes), OutputCap(max_bytes)
        host_timeout = False
        try:
            raw = exec_socket(sock)
            raw.settimeout(wait_s)
            if stdin is not None:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            _read_frames(exec_reader(sock, raw), out, err)
        except TimeoutError:
            host_timeout = True
        finally:
            sock.close()
        exit_code = 137 if host_timeout else self._exit_code(exec_id)
        return RawRun(
            exit_code=exit_code,
            stdout=out,
            stderr=err,
            duration_s=time.monotonic() - started,
            host_timeout=host_timeout,
        )

    def _exit_code(self, exec_id: str) -> int:
        for _ in range(50):
            info = self._client.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        raise BackendError(f"exec {exec_id[:12]} ended its output but never reported an exit code")


_CHDIR_FAILED = re.compile(r"OCI runtime exec failed: .*chdir to cwd .*? failed: ([^:]+)")
"""The runtime's words when an exec's working directory is missing or not a directory."""


def _check_started(run: RawRun, workdir: str) -> None:
    """Raise `PathRejected` when the exec never started because its workdir is unusable (the
    engine answers that as exit 126 with the runtime's message on stdout)."""
    found = _CHDIR_FAILED.search(run.stdout.text())
    if found:
        raise PathRejected(
            f"workdir {workdir!r} cannot be entered in the sandbox ({found.group(1).strip()}); "
            "create it first or give an existing directory"
        )


def _harbor_kwargs(kwargs: dict[str, Any], spec: SandboxSpec) -> dict[str, Any]:
    """Create options of a Harbor sandbox: the image's user and a writable root file system (the
    container, not the uid, is the boundary), a few capabilities back, read-only tool volumes."""
    from docker.types import Mount

    volumes = [Mount(target=t, source=s, type="volume", read_only=True) for s, t in spec.volumes.items()]
    kwargs = {k: v for k, v in kwargs.items() if k not in ("user", "tmpfs")}
    return kwargs | {
        "read_only": False,
        "cap_add": list(HARBOR_CAPS),
        "mounts": volumes,
        "environment": dict(spec.env),
    }


def _read_frames(recv: Callable[[int], bytes], out: OutputCap, err: OutputCap) -> None:
    """Demultiplex Docker's attach stream (8-byte header: stream, 0, 0, 0, big-endian size)."""
    buffer = bytearray()
    while True:
        chunk = recv(1 << 16)
        if not chunk:
            return
        buffer += chunk
        while len(buffer) >= 8:
            stream, size = buffer[0], struct.unpack(">I", buffer[4:8])[0]
            if len(buffer) < 8 + size:
                break
            payload = bytes(buffer[8 : 8 + size])
            del buffer[: 8 + size]
            (err if stream == 2 else out).add(payload)


def _engine_is_local(base_url: str | None) -> bool:
    """Whether the engine runs on this machine (a unix socket), so its /proc is ours."""
    url = base_url or os.environ.get("DOCKER_HOST") or "unix://"
    return url.startswith("unix://")
