"""Session manager: one sandbox per session, lifetimes, idle timeouts, reaper and warm pool.

The gateway is a thin HTTP layer over this class; tests and `stacx tasks check` use it
in-process. It has the `SandboxOps` methods, so `stacx.sandbox.verifier` runs against it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import posixpath
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stacx.sandbox.errors import (
    CapacityExceeded,
    InvalidSpec,
    RequestTooLarge,
    SessionExpired,
    SessionNotFound,
    TaskUnsupported,
)
from stacx.sandbox.images import PYTHON_DIR, TOOLS_DIR, TaskImageBuilder
from stacx.sandbox.limits import Reservation, SessionLimits
from stacx.sandbox.models import (
    DEFAULT_WORKDIR,
    ExecRequest,
    ExecResult,
    FileWritten,
    SessionInfo,
    SessionSpec,
    VerifyResult,
)
from stacx.sandbox.paths import check_archive, resolve_path, tar_files
from stacx.sandbox.protocols import SandboxBackend, SandboxHandle, SandboxSpec
from stacx.sandbox.reuse import Resettable, ReusePool, ShapeKey, shape_key
from stacx.sandbox.task_config import resolve_env
from stacx.sandbox.tasks import HarborTask, load_task
from stacx.sandbox.verifier import verify

__all__ = ["SessionManager"]

log = logging.getLogger(__name__)
_GONE_MEMORY = 256
"""How many closed session ids to remember, to tell 'expired' from 'never existed'."""


@dataclass(kw_only=True, slots=True)
class _Session:
    info: SessionInfo
    handle: SandboxHandle
    task: HarborTask | None = None
    busy: int = 0
    """Requests in flight; an idle timeout never closes a busy session."""
    client: str | None = None
    """Who created the session (the gateway's digest of the bearer token); None: anyone."""
    reuse: _Reuse | None = None
    """How the sandbox goes back to the reuse pool when the session closes; None: removed."""


@dataclass(frozen=True, slots=True)
class _Reuse:
    key: ShapeKey
    label_expires_at: float


@dataclass(kw_only=True, slots=True)
class _Resolved:
    spec: SandboxSpec
    task: HarborTask | None
    idle_timeout_s: float
    warnings: list[str]


class SessionManager:
    """Creates, drives and always cleans up sandboxes through one backend."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        owner: str = "stacx-gateway"
        """Deployment name on every sandbox; the reaper removes this owner's unknown sandboxes."""
        default_image: str = "stacx/sandbox:bookworm"
        """Image of sessions that name neither an image nor a task."""
        max_sessions: int = 512
        """Concurrent sessions allowed; more get `CapacityExceeded` (HTTP 503). The budget in
        `limits` usually binds first."""
        default_cpus: float = 1.0
        """CPU quota of a session that asks none (and its task neither)."""
        default_memory_mb: int = 1024
        """Memory limit of a session that asks none (and its task neither)."""
        default_pids: int = 256
        """Pids limit of a session that asks none."""
        limits: SessionLimits.Config = field(default_factory=SessionLimits.Config)
        """Operator-owned per-session maxima and total budget, checked against the host."""
        max_lifetime_s: float = 12 * 3600.0
        """Hard cap on a session's lifetime (also the default)."""
        idle_timeout_s: float = 1800.0
        """Default idle timeout (no request for this long closes the session)."""
        reap_interval_s: float = 30.0
        """Period of the reaper (expiry checks and orphan removal)."""
        max_output_bytes: int = 1 << 20
        """Per-stream output cap of one exec."""
        max_file_bytes: int = 64 << 20
        """Largest upload or download."""
        warm_pool_size: int = 0
        """Pre-started sandboxes of `default_image` kept ready (0: none)."""
        reuse_pool_size: int = 0
        """Closed sessions' sandboxes kept, reset (every sandbox process killed, the writable
        mounts emptied), for the next session of the same image, limits and environment
        (0: every session gets a new sandbox). Plain image sandboxes only, never task ones.
        Kept sandboxes hold their share of the budget; a session that needs it evicts them."""
        reuse_idle_s: float = 120.0
        """A kept sandbox unused this long is removed by the reaper."""
        allowed_task_roots: tuple[str, ...] = ()
        """Directories `task_dir` must be under (empty: any directory of the gateway host)."""

    def __init__(
        self,
        config: Config,
        backend: SandboxBackend,
        *,
        images: TaskImageBuilder | None = None,
    ) -> None:
        if config.max_sessions < 1:
            raise InvalidSpec(f"SessionManager.Config.max_sessions must be >= 1, got {config.max_sessions}")
        self.config = config
        self.backend = backend
        self.images = images
        defaults = Reservation(
            cpus=config.default_cpus, memory_mb=config.default_memory_mb, pids=config.default_pids
        )
        self.limits = SessionLimits(
            config.limits, backend.capacity, defaults=defaults, default_idle_timeout_s=config.idle_timeout_s
        )
        """The resolved maxima and budget, and what live sandboxes hold of it."""
        self.instance = uuid.uuid4().hex[:12]
        self.stats: defaultdict[str, float] = defaultdict(float)
        """Counters served on /metrics."""
        self._pool_filling = 0
        self._sessions: dict[str, _Session] = {}
        self._starting: set[str] = set()
        self._gone: dict[str, str] = {}
        self._pool: list[tuple[SandboxHandle, float]] = []
        """Warm sandboxes and the expiry written on their labels."""
        self._reuse = ReusePool()
        """Reset sandboxes of closed sessions, by shape."""
        self._returning: set[str] = set()
        """Sandbox ids being reset on their way into the reuse pool."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Background pool fills and discards."""
        self._closing = False
        self._reaper: asyncio.Task[None] | None = None

    # -- lifecycle of the manager -------------------------------------------------------------
    async def start(self) -> None:
        """Remove what an earlier gateway of this owner left, start the reaper, fill the pool."""
        self._closing = False
        removed = await self.backend.reap(owner=self.config.owner, keep=set())
        self.stats["reaped_total"] += removed
        if removed:
            log.warning("reaped %d sandboxes left by an earlier gateway (%s)", removed, self.config.owner)
        self._reaper = asyncio.create_task(self._reap_forever(), name="sandbox-reaper")
        self._refill_pool()

    async def stop(self) -> None:
        """Close every session and pooled sandbox."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        self._closing = True
        # Pool fills and discards finish on their own (a thread cannot be cancelled, and a
        # cancelled start would leave its container behind); they stop what they start.
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        handles = [s.handle for s in self._sessions.values()] + [h for h, _ in self._pool]
        handles += self._reuse.drain()
        for session_id in self._sessions:
            self.limits.release(session_id)
        self._sessions.clear()
        self._pool.clear()
        for handle in handles:
            self.limits.release(handle.session_id)
        await asyncio.gather(*(self._stop_quietly(h) for h in handles))

    async def __aenter__(self) -> SessionManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _stop_quietly(self, handle: SandboxHandle) -> None:
        try:
            await self.backend.stop(handle)
        except Exception:
            log.exception("removing sandbox %s failed; the reaper will retry", handle.ref)

    # -- sessions ------------------------------------------------------------------------------
    async def create(self, spec: SessionSpec | None = None, *, client: str | None = None) -> SessionInfo:
        """Start a sandbox for `spec` (default: the default image) and return its session.

        `LimitExceeded` when it asks more than the operator's maxima, `CapacityExceeded` when
        the sessions already hold the budget. `client` (an opaque id of the caller) is kept for
        `client_of`."""
        spec = spec or SessionSpec()
        if len(self._sessions) + len(self._starting) >= self.config.max_sessions:
            raise CapacityExceeded(
                f"the gateway already runs {self.config.max_sessions} sessions "
                "(SessionManager.Config.max_sessions); close some or retry later"
            )
        session_id = f"sb-{uuid.uuid4().hex[:16]}"
        self._starting.add(session_id)
        reuse: _Reuse | None = None
        try:
            resolved = await self._resolve(spec, session_id)
            handle = self._take_pooled(spec, resolved.spec)  # holds its own reservation
            if handle is None:
                handle, reuse = self._take_reused(resolved.spec, session_id)
            if handle is None:
                await self._reserve(session_id, resolved.spec)
                handle, reuse = await self._start_new(resolved.spec)
        except BaseException:
            self.limits.release(session_id)
            raise
        finally:
            self._starting.discard(session_id)
        now = time.time()
        info = SessionInfo(
            id=session_id if reuse else handle.session_id,
            image=resolved.spec.image,
            backend=self.backend.name,
            workdir=resolved.spec.workdir,
            cpus=resolved.spec.cpus,
            memory_mb=resolved.spec.memory_mb,
            pids=resolved.spec.pids,
            network="none",
            created_at=now,
            expires_at=resolved.spec.expires_at,
            idle_timeout_s=resolved.idle_timeout_s,
            last_used_at=now,
            task_name=resolved.task.name if resolved.task else None,
            harbor=resolved.spec.harbor,
            warnings=resolved.warnings + handle.notes,
        )
        self._sessions[info.id] = _Session(
            info=info, handle=handle, task=resolved.task, client=client, reuse=reuse
        )
        self.stats["sessions_created_total"] += 1
        return info

    async def _reserve(self, session_id: str, spec: SandboxSpec) -> None:
        """Hold the budget for a new sandbox, evicting kept (reuse pool) sandboxes when they are
        what stands in the way."""
        while True:
            try:
                self.limits.reserve(session_id, _reservation(spec))
                return
            except CapacityExceeded:
                victim = self._reuse.pop_oldest()
                if victim is None:
                    raise
                await self._remove(victim, counter="reuse_evicted_total")

    async def _start_new(self, spec: SandboxSpec) -> tuple[SandboxHandle, _Reuse | None]:
        """Start a sandbox; one that may be reused later is labelled to live the gateway's
        maximum lifetime (each session still ends at its own expiry)."""
        key = self._reuse_key(spec)
        if key is None:
            return await self._start_sandbox(spec), None
        label_expires_at = max(spec.expires_at, time.time() + self.config.max_lifetime_s)
        handle = await self._start_sandbox(dataclasses.replace(spec, expires_at=label_expires_at))
        return handle, _Reuse(key=key, label_expires_at=label_expires_at)

    def _reuse_key(self, spec: SandboxSpec) -> ShapeKey | None:
        """The reuse key of a sandbox this gateway may reuse: reuse on, a backend that can reset,
        a shape that qualifies; else None (the sandbox is removed when its session ends)."""
        if self.config.reuse_pool_size <= 0 or not isinstance(self.backend, Resettable):
            return None
        return shape_key(spec)

    def _take_reused(self, spec: SandboxSpec, session_id: str) -> tuple[SandboxHandle | None, _Reuse | None]:
        key = self._reuse_key(spec)
        taken = self._reuse.take(key, until=spec.expires_at) if key is not None else None
        if key is None or taken is None:
            return None, None
        handle, label_expires_at = taken
        handle.notes = []
        self.limits.transfer(handle.session_id, session_id)
        self.stats["sessions_reused_total"] += 1
        return handle, _Reuse(key=key, label_expires_at=label_expires_at)

    async def _resolve(self, spec: SessionSpec, session_id: str) -> _Resolved:
        if spec.image and spec.task_dir:
            raise InvalidSpec("give either image or task_dir, not both")
        task = self._load_task(spec.task_dir) if spec.task_dir else None
        image = spec.image or self.config.default_image
        warnings: list[str] = []
        volumes: dict[str, str] = {}
        if task is not None:
            image, warnings, volumes = await self._task_image(task)
        image_workdir = await self.backend.image_workdir(image)
        if task is not None:
            workdir = spec.workdir or task.workdir or image_workdir or "/"
        else:
            workdir = spec.workdir or (image_workdir if image_workdir != "/" else None) or DEFAULT_WORKDIR
        lifetime = min(spec.lifetime_s or self.config.max_lifetime_s, self.config.max_lifetime_s)
        if spec.lifetime_s is not None and spec.lifetime_s > self.config.max_lifetime_s:
            warnings = [
                *warnings,
                f"lifetime_s {spec.lifetime_s:g} is above this gateway's maximum "
                f"({self.config.max_lifetime_s:g} s): the session ends after {lifetime:g} s",
            ]
        sandbox = SandboxSpec(
            session_id=session_id,
            owner=self.config.owner,
            instance=self.instance,
            image=image,
            workdir=workdir,
            seed_workdir=task is None and image_workdir not in (None, "/") and workdir == image_workdir,
            cpus=spec.cpus or (task.cpus if task else self.config.default_cpus),
            memory_mb=spec.memory_mb or (task.memory_mb if task else self.config.default_memory_mb),
            pids=spec.pids or self.config.default_pids,
            env={
                **(resolve_env(task.env, f"{task.path}/task.toml [environment.env]") if task else {}),
                **spec.env,
            },
            expires_at=time.time() + lifetime,
            harbor=task is not None,
            volumes=volumes,
        )
        idle = spec.idle_timeout_s or self.config.idle_timeout_s
        source = "the session request"
        if task is not None:
            source = f"the session for task {task.name} (request and task.toml)"
        self.limits.check_ask(_reservation(sandbox), idle, source=source)
        return _Resolved(spec=sandbox, task=task, idle_timeout_s=idle, warnings=warnings)

    async def _task_image(self, task: HarborTask) -> tuple[str, list[str], dict[str, str]]:
        """Image, warnings and tool volumes of a Harbor task session."""
        if task.unsupported:
            raise TaskUnsupported(f"task {task.name}: {task.unsupported}")
        if self.images is None:
            raise InvalidSpec(
                f"task_dir sessions need task images, which the {self.backend.name} backend "
                "cannot build; run the gateway with the docker backend"
            )
        choice = await self.images.resolve(task)
        warnings = task.warnings + choice.notes
        volume = await asyncio.to_thread(self.images.tools_volume)
        if volume is None:
            warnings.append(
                f"verifier tools image {self.images.config.tools_image} is not built: a test.sh that "
                "installs uv/pytest at verify time needs network (`stacx tasks images build`)"
            )
        volumes = {volume: TOOLS_DIR} if volume else {}
        python = await asyncio.to_thread(self.images.python_volume)
        if python is not None:
            volumes[python] = PYTHON_DIR
        return choice.tag, warnings, volumes

    def _load_task(self, task_dir: str) -> HarborTask:
        if "\0" in task_dir:
            raise InvalidSpec("task_dir holds a NUL character, which no path can")
        path = Path(task_dir).resolve()
        roots = [Path(r).resolve() for r in self.config.allowed_task_roots]
        if roots and not any(path.is_relative_to(r) for r in roots):
            raise InvalidSpec(f"task_dir {task_dir!r} is outside the gateway's allowed task roots")
        return load_task(path)

    def get(self, session_id: str) -> SessionInfo:
        """The live session `session_id`."""
        return self._session(session_id).info

    def list(self) -> list[SessionInfo]:
        """Every live session."""
        return [s.info for s in self._sessions.values()]

    @property
    def warm(self) -> int:
        """Pre-started sandboxes ready in the warm pool."""
        return len(self._pool)

    @property
    def reusable(self) -> int:
        """Reset sandboxes of closed sessions waiting in the reuse pool."""
        return len(self._reuse)

    def touch(self, session_id: str) -> SessionInfo:
        """Count as a request now: restarts the idle timeout (clients renew long-lived sessions
        that go quiet, e.g. while the model thinks); the hard lifetime is unchanged."""
        session = self._session(session_id)
        session.info.last_used_at = time.time()
        return session.info

    def task(self, session_id: str) -> HarborTask | None:
        """The Harbor task the session was created for, if any."""
        return self._session(session_id).task

    def client_of(self, session_id: str) -> str | None:
        """Who created the live session `session_id` (the `client` given to `create`)."""
        return self._session(session_id).client

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            reason = self._gone.get(session_id)
            if reason:
                raise SessionExpired(f"session {session_id} was closed ({reason})")
            raise SessionNotFound(f"no session {session_id}")
        return session

    async def close(self, session_id: str, *, reason: str = "closed by client") -> None:
        """Remove the session's sandbox (or reset it for the reuse pool, in the background)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            self._session(session_id)  # raises the right error
            return
        self._forget(session_id, reason)
        self.stats["sessions_closed_total"] += 1
        handle = session.handle
        if session.reuse is not None and self._reuse_room():
            self.limits.transfer(session_id, handle.session_id)  # the kept sandbox holds its share
            self._returning.add(handle.session_id)
            self._background(self._return_for_reuse(handle, session.reuse))
            return
        await self._stop_quietly(handle)
        self.limits.release(session_id)

    def _reuse_room(self) -> bool:
        return not self._closing and len(self._reuse) + len(self._returning) < self.config.reuse_pool_size

    async def _return_for_reuse(self, handle: SandboxHandle, reuse: _Reuse) -> None:
        """Reset a closed session's sandbox into the reuse pool, or remove it when the reset
        fails, the gateway stops or its label would expire within the next minute."""
        try:
            assert isinstance(self.backend, Resettable)
            try:
                clean = await self.backend.reset(handle)
            except Exception:
                log.exception("resetting sandbox %s failed; removing it", handle.ref)
                clean = False
            if clean and not self._closing and reuse.label_expires_at - time.time() > 60.0:
                self._reuse.put(reuse.key, handle, label_expires_at=reuse.label_expires_at)
                self.stats["sandboxes_reset_total"] += 1
                return
            await self._remove(handle, counter="reset_failures_total" if not clean else None)
        finally:
            self._returning.discard(handle.session_id)

    async def _remove(self, handle: SandboxHandle, *, counter: str | None = None) -> None:
        """Remove a sandbox that no session holds, and give back its share of the budget."""
        if counter:
            self.stats[counter] += 1
        await self._stop_quietly(handle)
        self.limits.release(handle.session_id)

    def _forget(self, session_id: str, reason: str) -> None:
        self._gone[session_id] = reason
        while len(self._gone) > _GONE_MEMORY:
            self._gone.pop(next(iter(self._gone)))

    @contextlib.asynccontextmanager
    async def _use(self, session_id: str) -> AsyncIterator[_Session]:
        session = self._session(session_id)
        session.busy += 1
        try:
            yield session
        finally:
            session.busy -= 1
            session.info.last_used_at = time.time()

    # -- operations (SandboxOps) ---------------------------------------------------------------
    async def exec(
        self,
        session_id: str,
        command: str,
        *,
        timeout_s: float = 60.0,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run `command` with `bash -c` in the session."""
        _check_command_size(command)
        async with self._use(session_id) as session:
            if workdir is not None:
                workdir = resolve_path(workdir, session.info.workdir, anywhere=session.info.harbor)
            request = _exec_request(command, timeout_s, stdin, env or {}, workdir)
            cap = min(max_output_bytes or self.config.max_output_bytes, self.config.max_output_bytes)
            started = time.monotonic()
            result = await self.backend.exec(session.handle, request, max_output_bytes=cap)
            self.stats["execs_total"] += 1
            self.stats["exec_seconds_total"] += time.monotonic() - started
            self.stats["exec_timeouts_total"] += int(result.timed_out)
            self.stats["exec_oom_kills_total"] += int(result.oom_killed)
            return result

    async def upload(self, session_id: str, path: str, data: bytes, *, mode: int = 0o644) -> FileWritten:
        """Write one file (parent directories created)."""
        self._check_size(len(data))
        async with self._use(session_id) as session:
            full = resolve_path(path, session.info.workdir, anywhere=session.info.harbor)
            directory, name = posixpath.split(full)
            if not name:
                raise InvalidSpec(f"upload path {path!r} names a directory, not a file")
            archive = tar_files({name: data}, mode=mode)
            await self.backend.write_archive(session.handle, directory, archive)
            self.stats["uploads_total"] += 1
            return FileWritten(path=full, size=len(data))

    async def upload_archive(self, session_id: str, dest: str, data: bytes) -> None:
        """Extract a tar archive (plain files and directories only) into `dest`."""
        self._check_size(len(data))
        check_archive(data)
        async with self._use(session_id) as session:
            full = resolve_path(dest, session.info.workdir, anywhere=session.info.harbor)
            await self.backend.write_archive(session.handle, full, data)
            self.stats["uploads_total"] += 1

    async def download(self, session_id: str, path: str) -> bytes:
        """Bytes of one file."""
        async with self._use(session_id) as session:
            full = resolve_path(path, session.info.workdir, anywhere=session.info.harbor)
            data = await self.backend.read_file(session.handle, full, max_bytes=self.config.max_file_bytes)
            self.stats["downloads_total"] += 1
            return data

    async def download_archive(self, session_id: str, path: str) -> bytes:
        """A tar archive of one directory."""
        async with self._use(session_id) as session:
            full = resolve_path(path, session.info.workdir, anywhere=session.info.harbor)
            data = await self.backend.read_archive(session.handle, full, max_bytes=self.config.max_file_bytes)
            self.stats["downloads_total"] += 1
            return data

    async def verify(self, session_id: str, task: HarborTask | str | Path | None = None) -> VerifyResult:
        """Run a Harbor verifier in the session (default: the task it was created for; its last step)."""
        if task is None:
            task = self._session(session_id).task
            if task is None:
                raise InvalidSpec(f"session {session_id} was not created from a task; pass task_dir")
        elif not isinstance(task, HarborTask):
            task = self._load_task(str(task))
        result = await verify(self, session_id, task)
        self.stats["verifications_total"] += 1
        return result

    def _check_size(self, size: int) -> None:
        if size > self.config.max_file_bytes:
            raise InvalidSpec(
                f"upload of {size} bytes exceeds SessionManager.Config.max_file_bytes "
                f"({self.config.max_file_bytes})"
            )

    # -- reaper and pool -----------------------------------------------------------------------
    async def reap_once(self) -> int:
        """Close expired and idle sessions, then remove this owner's unknown sandboxes."""
        now = time.time()
        doomed: list[tuple[str, str]] = []
        for sid, session in self._sessions.items():
            if now >= session.info.expires_at:
                doomed.append((sid, "maximum lifetime reached"))
            elif session.busy == 0 and now - session.info.last_used_at >= session.info.idle_timeout_s:
                doomed.append((sid, "idle timeout"))
        for sid, reason in doomed:
            self.stats["sessions_expired_total"] += 1
            await self.close(sid, reason=reason)
        for handle in self._reuse.pop_idle(self.config.reuse_idle_s):
            await self._remove(handle, counter="reuse_evicted_total")
        keep = set(self._sessions) | {s.handle.session_id for s in self._sessions.values()}
        keep |= self._starting | {h.session_id for h, _ in self._pool}
        keep |= self._reuse.sandbox_ids | self._returning
        orphans = await self.backend.reap(owner=self.config.owner, keep=keep)
        self.stats["reaped_total"] += orphans
        return len(doomed) + orphans

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            try:
                await self.reap_once()
            except Exception:
                log.exception("reaper pass failed; retrying in %.0f s", self.config.reap_interval_s)

    def _pool_compatible(self, spec: SessionSpec) -> bool:
        plain = spec.task_dir is None and spec.workdir is None and spec.lifetime_s is None
        limits = (spec.cpus, spec.memory_mb, spec.pids) == (None, None, None)
        return plain and limits and (spec.image or self.config.default_image) == self.config.default_image

    def _take_pooled(self, spec: SessionSpec, resolved: SandboxSpec) -> SandboxHandle | None:
        if not self._pool or not self._pool_compatible(spec):
            return None
        handle, expires_at = self._pool.pop()
        handle.env = {**handle.env, **resolved.env}
        resolved.expires_at = min(resolved.expires_at, expires_at)
        self.stats["pool_hits_total"] += 1
        self._refill_pool()
        return handle

    def _background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_sandbox(self, spec: SandboxSpec) -> SandboxHandle:
        """backend.start that never leaks: if the caller is cancelled mid-start (client gone),
        the sandbox is removed as soon as it exists."""
        start = asyncio.ensure_future(self.backend.start(spec))
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            start.add_done_callback(self._discard_started)
            raise

    def _discard_started(self, start: asyncio.Future[SandboxHandle]) -> None:
        if not start.cancelled() and start.exception() is None:
            self._background(self._stop_quietly(start.result()))

    def _refill_pool(self) -> None:
        if self._closing:
            return
        missing = self.config.warm_pool_size - len(self._pool) - self._pool_filling
        for _ in range(max(missing, 0)):
            self._background(self._add_pooled())

    async def _add_pooled(self) -> None:
        self._pool_filling += 1
        try:
            resolved = await self._resolve(SessionSpec(), f"sb-{uuid.uuid4().hex[:16]}")
            sandbox_id = resolved.spec.session_id
            self._starting.add(sandbox_id)
            try:
                self.limits.reserve(sandbox_id, _reservation(resolved.spec))
                handle = await self.backend.start(resolved.spec)
                if self._closing:
                    await self._stop_quietly(handle)
                    self.limits.release(sandbox_id)
                else:
                    self._pool.append((handle, resolved.spec.expires_at))
            except BaseException:
                self.limits.release(sandbox_id)
                raise
            finally:
                self._starting.discard(sandbox_id)
        except Exception:
            log.exception("starting a warm-pool sandbox failed")
        finally:
            self._pool_filling -= 1


def _reservation(spec: SandboxSpec) -> Reservation:
    return Reservation(cpus=spec.cpus, memory_mb=spec.memory_mb, pids=spec.pids)


MAX_COMMAND_BYTES = (128 << 10) - 1
"""Longest `bash -c` command: Linux refuses a longer single argument (MAX_ARG_STRLEN)."""


def _check_command_size(command: str) -> None:
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        raise RequestTooLarge(
            f"command is {size} bytes; a command line takes at most {MAX_COMMAND_BYTES} bytes "
            "(Linux MAX_ARG_STRLEN): upload a script and run it, or send the data as stdin"
        )


def _exec_request(
    command: str, timeout_s: float, stdin: str | None, env: dict[str, str], workdir: str | None
) -> ExecRequest:
    """The backend's request; a bad field is `InvalidSpec` naming it (the gateway's route checks
    the same model first and answers 422)."""
    try:
        return ExecRequest(command=command, timeout_s=timeout_s, stdin=stdin, env=env, workdir=workdir)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidSpec(f"exec request: {problems}") from exc
