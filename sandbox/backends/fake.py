"""In-memory backend for unit tests: files live in a dict, commands go to a handler you supply."""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from stacx.sandbox.errors import BackendError, SandboxFileNotFound
from stacx.sandbox.models import ExecRequest, ExecResult
from stacx.sandbox.protocols import HostCapacity, SandboxHandle, SandboxSpec

__all__ = ["FAKE_HOST", "FakeBackend", "FakeSandbox"]

FAKE_HOST = HostCapacity(cpus=64.0, memory_mb=1 << 20, pid_max=1 << 22)
"""A host large enough for any test's budget."""


@dataclass(kw_only=True, slots=True)
class FakeSandbox:
    """State of one fake sandbox."""

    spec: SandboxSpec
    files: dict[str, bytes] = field(default_factory=dict)
    """Absolute path -> content."""
    commands: list[str] = field(default_factory=list)
    """Every command exec'd, in order."""


Handler = Callable[[FakeSandbox, ExecRequest], Awaitable[ExecResult] | ExecResult]


def _echo(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    return ExecResult(exit_code=0, stdout=request.command, stderr="", duration_s=0.0)


class FakeBackend:
    """Records what it is asked; `handler(sandbox, request)` decides each exec's result."""

    name = "fake"

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        image_workdirs: dict[str, str] | None = None,
        capacity: HostCapacity = FAKE_HOST,
    ) -> None:
        self.handler: Handler = handler or _echo
        self.capacity = capacity
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.stopped: list[str] = []
        self.orphans: dict[str, tuple[str, float]] = {}
        """Sandboxes left by an earlier gateway: ref -> (owner, expires_at); reap removes them."""
        self.image_workdirs = image_workdirs or {}
        self.closed = False
        self.resets: list[str] = []
        """Sandbox ids reset for reuse, in order."""
        self.reset_ok = True
        """What `reset` answers (False: the sandbox cannot be made clean)."""

    @property
    def problem(self) -> str | None:
        """Never degraded (`stacx.sandbox.testing.WedgingBackend` is a fake that wedges)."""
        return None

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        ref = f"fake-{spec.session_id}"
        self.sandboxes[ref] = FakeSandbox(spec=spec)
        handle = SandboxHandle(session_id=spec.session_id, ref=ref, workdir=spec.workdir, env=spec.env)
        handle.writable = {} if spec.harbor or spec.volumes else {spec.workdir: "755"}
        return handle

    def _get(self, handle: SandboxHandle) -> FakeSandbox:
        if handle.ref not in self.sandboxes:
            raise BackendError(f"fake sandbox {handle.ref} is gone")
        return self.sandboxes[handle.ref]

    async def exec(self, handle: SandboxHandle, request: ExecRequest, *, max_output_bytes: int) -> ExecResult:
        sandbox = self._get(handle)
        sandbox.commands.append(request.command)
        started = time.monotonic()
        result = self.handler(sandbox, request)
        if not isinstance(result, ExecResult):
            result = await result
        cut_out, cut_err = len(result.stdout) > max_output_bytes, len(result.stderr) > max_output_bytes
        return result.model_copy(
            update={
                "stdout": result.stdout[:max_output_bytes],
                "stderr": result.stderr[:max_output_bytes],
                "stdout_truncated": result.stdout_truncated or cut_out,
                "stderr_truncated": result.stderr_truncated or cut_err,
                "duration_s": result.duration_s or time.monotonic() - started,
            }
        )

    async def write_archive(self, handle: SandboxHandle, dest: str, data: bytes) -> None:
        sandbox = self._get(handle)
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive.getmembers():
                if member.isfile():
                    content = archive.extractfile(member)
                    assert content is not None
                    path = posixpath.normpath(posixpath.join(dest, member.name))
                    sandbox.files[path] = content.read()

    async def read_file(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        sandbox = self._get(handle)
        if path not in sandbox.files:
            raise SandboxFileNotFound(f"{path} does not exist in the sandbox (or is not a file)")
        return sandbox.files[path][:max_bytes]

    async def read_archive(self, handle: SandboxHandle, path: str, *, max_bytes: int) -> bytes:
        sandbox = self._get(handle)
        prefix = path.rstrip("/") + "/"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for name, content in sorted(sandbox.files.items()):
                if name.startswith(prefix):
                    info = tarfile.TarInfo(name[len(prefix) :])
                    info.size = len(content)
                    archive.addfile(info, io.BytesIO(content))
        return buffer.getvalue()

    async def reset(self, handle: SandboxHandle) -> bool:
        sandbox = self._get(handle)
        self.resets.append(handle.session_id)
        if self.reset_ok and handle.writable:
            sandbox.files.clear()
            return True
        return False

    async def stop(self, handle: SandboxHandle) -> None:
        if self.sandboxes.pop(handle.ref, None) is not None:
            self.stopped.append(handle.session_id)

    async def reap(self, *, owner: str, keep: set[str]) -> int:
        now = time.time()
        doomed = [ref for ref, (who, expires) in self.orphans.items() if who == owner or expires < now]
        doomed += [
            ref
            for ref, box in self.sandboxes.items()
            if (box.spec.owner == owner and box.spec.session_id not in keep) or box.spec.expires_at < now
        ]
        for ref in doomed:
            self.orphans.pop(ref, None)
            self.sandboxes.pop(ref, None)
        return len(doomed)

    async def image_workdir(self, image: str) -> str | None:
        return self.image_workdirs.get(image)

    async def close(self) -> None:
        self.closed = True
