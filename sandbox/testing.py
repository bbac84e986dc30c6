"""Run a gateway in-process for tests and tools: uvicorn on a free 127.0.0.1 port in a thread.

    with serve_gateway(FakeBackend(), token="t") as url:
        async with SandboxClient(SandboxClient.Config(base_url=url, token="t")) as client: ...

The server's lifespan starts the session manager (reaping this owner's leftovers) and closes
every session on exit, so tests cannot leak sandboxes past the `with` block.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stacx.sandbox.backends.fake import FakeBackend
from stacx.sandbox.backends.lifecycle import LifecycleGuard
from stacx.sandbox.gateway import KEEP_ALIVE_S, create_app
from stacx.sandbox.images import ImageChoice, TaskImageBuilder
from stacx.sandbox.protocols import SandboxBackend, SandboxHandle, SandboxSpec
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.tasks import HarborTask

__all__ = ["FakeBackend", "FakeTaskImages", "WedgingBackend", "gateway_process", "serve_app", "serve_gateway"]


@contextmanager
def serve_app(app: Any, *, host: str = "127.0.0.1", start_timeout_s: float = 30.0) -> Iterator[str]:
    """Serve an ASGI app on a free port in a daemon thread; yields its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", backlog=4096, timeout_keep_alive=KEEP_ALIVE_S
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the in-process gateway did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(120)
        sock.close()


@contextmanager
def serve_gateway(
    backend: SandboxBackend,
    *,
    token: str | None = "test-token",
    config: SessionManager.Config | None = None,
    images: Any = None,
) -> Iterator[str]:
    """A full gateway over `backend` (owner unique to this call unless `config` sets one)."""
    config = config or SessionManager.Config(owner=f"test-{uuid.uuid4().hex[:8]}")
    manager = SessionManager(config, backend, images=images)
    with serve_app(create_app(manager, token=token)) as url:
        yield url


class WedgingBackend(FakeBackend):
    """A fake whose container starts hang like a wedged Docker engine's, behind the same
    `LifecycleGuard` as the Docker backend (stuck after `stuck_after_s`); `release` ends the hang."""

    def __init__(self, *, stuck_after_s: float = 0.3) -> None:
        super().__init__()
        self.release = threading.Event()
        self.guard = LifecycleGuard(
            engine="unix:///fake-docker.sock",
            concurrency=2,
            stuck_after_s=stuck_after_s,
            probe=self._probe,
            probe_every_s=0.05,
            hint=" Fix: restart the engine.",
        )

    def _probe(self) -> None:
        if not self.release.is_set():
            raise ConnectionError("the fake engine does not answer")

    @property
    def problem(self) -> str | None:
        return self.guard.problem

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        await self.guard.run(f"create a container from {spec.image}", self.release.wait)
        return await super().start(spec)

    async def close(self) -> None:
        self.release.set()
        self.guard.close()
        await super().close()


@contextmanager
def gateway_process(
    *args: str, token: str, start_timeout_s: float = 120.0, stop_timeout_s: float = 300.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`stacx gateway ARGS` in its own process on a free 127.0.0.1 port, as deployed; yields
    (url, process) once /healthz answers; SIGTERM on exit (the gateway closes its sessions)."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stacx = Path(sys.executable).with_name("stacx")
    command = [str(stacx), "gateway", "--port", str(port), "--token", token, *args]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _healthy(httpx, url):
            if process.poll() is not None:
                stderr = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"gateway exited: {stderr[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not become healthy in {start_timeout_s:.0f} s")
            time.sleep(0.1)
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(httpx: Any, url: str) -> bool:
    try:
        return bool(httpx.get(f"{url}/healthz", timeout=2).status_code == 200)
    except httpx.HTTPError:
        return False


class FakeTaskImages:
    """Stands in for `TaskImageBuilder`: every task resolves to its own tag, nothing is built."""

    def __init__(self, tools_volume: str | None = "tools-vol", python_volume: str | None = None) -> None:
        self.built: list[str] = []
        self.volume = tools_volume
        self.python = python_volume
        self.config = TaskImageBuilder.Config()

    async def resolve(self, task: HarborTask) -> ImageChoice:
        self.built.append(task.name)
        return ImageChoice(tag=task.image_tag, notes=["FROM x -> y"])

    def tools_volume(self) -> str | None:
        return self.volume

    def python_volume(self) -> str | None:
        return self.python
