"""The sandbox gateway: FastAPI over a `SessionManager`, with bearer-token auth on by default.

Routes (all under bearer auth except /healthz):
    GET    /healthz                            -> Health (503 when the backend is degraded)
    GET    /metrics                            -> Prometheus text
    POST   /v1/sessions          SessionSpec   -> SessionInfo (201)
    GET    /v1/sessions                        -> [SessionInfo]
    GET    /v1/sessions/{id}                   -> SessionInfo
    DELETE /v1/sessions/{id}                   -> 204
    POST   /v1/sessions/{id}/touch             -> SessionInfo (restarts the idle timeout)
    POST   /v1/sessions/{id}/exec ExecRequest  -> ExecResult
    PUT    /v1/sessions/{id}/files?path=P      raw bytes -> FileWritten
    GET    /v1/sessions/{id}/files?path=P      -> raw bytes
    PUT    /v1/sessions/{id}/archive?path=D    tar -> 204
    GET    /v1/sessions/{id}/archive?path=D    -> tar
    POST   /v1/sessions/{id}/verify  {"task_dir": optional} -> VerifyResult
Errors: `{"error": {"type": <SandboxError subclass>, "message": ...}}` with the class's status.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from sandbox.errors import AuthError, InvalidSpec, SandboxError
from sandbox.models import (
    ExecRequest,
    ExecResult,
    FileWritten,
    Health,
    SessionInfo,
    SessionSpec,
    VerifyResult,
)
from sandbox.protocols import SandboxBackend
from sandbox.sessions import SessionManager

__all__ = ["KEEP_ALIVE_S", "TOKEN_ENV", "Gateway", "create_app"]

TOKEN_ENV = "STACX_SANDBOX_TOKEN"
KEEP_ALIVE_S = 75
"""Server keep-alive timeout, well above the client's keep-alive expiry (see SandboxClient)."""
VERSION = "1"
log = logging.getLogger(__name__)


class _VerifyRequest(BaseModel):
    task_dir: str | None = None


def _error_response(exc: SandboxError) -> JSONResponse:
    body = {"error": {"type": type(exc).__name__, "message": str(exc), "retriable": exc.retriable}}
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _auth_dependency(token: str | None) -> Callable[[Request], Awaitable[None]]:
    expected = f"Bearer {token}".encode() if token else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise AuthError("missing or wrong bearer token (Authorization: Bearer <token>)")

    return check


def _metrics_text(manager: SessionManager) -> str:
    lines = [
        "# TYPE stacx_sandbox_sessions_active gauge",
        f"stacx_sandbox_sessions_active {len(manager.list())}",
    ]
    for name, value in sorted(manager.stats.items()):
        lines += [f"# TYPE stacx_sandbox_{name} counter", f"stacx_sandbox_{name} {value:g}"]
    return "\n".join(lines) + "\n"


def create_app(manager: SessionManager, *, token: str | None, manage_lifecycle: bool = True) -> FastAPI:
    """The gateway app. `token=None` disables auth (tests only); the lifespan starts and stops
    `manager` unless `manage_lifecycle` is False."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await manager.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await manager.stop()
                await manager.backend.close()

    app = FastAPI(title="STACX sandbox gateway", version=VERSION, lifespan=lifespan)

    @app.exception_handler(SandboxError)
    async def sandbox_error(_request: Request, exc: SandboxError) -> JSONResponse:
        return _error_response(exc)

    auth = [Depends(_auth_dependency(token))]

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    async def health(response: Response) -> Health:
        problem = manager.backend.problem
        if problem:
            response.status_code = 503  # load balancers and `stacx run` see a degraded gateway
        return Health(
            status="degraded" if problem else "ok",
            backend=manager.backend.name,
            sessions=len(manager.list()),
            version=VERSION,
            problem=problem,
        )

    @app.get("/metrics", dependencies=auth, response_class=PlainTextResponse)
    async def metrics() -> str:
        return _metrics_text(manager)

    @app.post("/v1/sessions", dependencies=auth, status_code=201, response_model=SessionInfo)
    async def create_session(spec: SessionSpec) -> SessionInfo:
        return await manager.create(spec)

    @app.get("/v1/sessions", dependencies=auth, response_model=list[SessionInfo])
    async def list_sessions() -> list[SessionInfo]:
        return manager.list()

    @app.get("/v1/sessions/{session_id}", dependencies=auth, response_model=SessionInfo)
    async def get_session(session_id: str) -> SessionInfo:
        return manager.get(session_id)

    @app.delete("/v1/sessions/{session_id}", dependencies=auth, status_code=204)
    async def delete_session(session_id: str) -> Response:
        await manager.close(session_id)
        return Response(status_code=204)

    @app.post("/v1/sessions/{session_id}/touch", dependencies=auth, response_model=SessionInfo)
    async def touch_session(session_id: str) -> SessionInfo:
        return manager.touch(session_id)

    @app.post("/v1/sessions/{session_id}/exec", dependencies=auth, response_model=ExecResult)
    async def exec_command(session_id: str, request: ExecRequest) -> ExecResult:
        return await manager.exec(
            session_id,
            request.command,
            timeout_s=request.timeout_s,
            stdin=request.stdin,
            env=request.env,
            workdir=request.workdir,
            max_output_bytes=request.max_output_bytes,
        )

    @app.put("/v1/sessions/{session_id}/files", dependencies=auth, response_model=FileWritten)
    async def upload_file(
        session_id: str, request: Request, path: str = Query(...), mode: int = Query(0o644)
    ) -> FileWritten:
        return await manager.upload(session_id, path, await _body(request, manager), mode=mode)

    @app.get("/v1/sessions/{session_id}/files", dependencies=auth)
    async def download_file(session_id: str, path: str = Query(...)) -> Response:
        data = await manager.download(session_id, path)
        return Response(data, media_type="application/octet-stream")

    @app.put("/v1/sessions/{session_id}/archive", dependencies=auth, status_code=204)
    async def upload_archive(session_id: str, request: Request, path: str = Query(...)) -> Response:
        await manager.upload_archive(session_id, path, await _body(request, manager))
        return Response(status_code=204)

    @app.get("/v1/sessions/{session_id}/archive", dependencies=auth)
    async def download_archive(session_id: str, path: str = Query(...)) -> Response:
        data = await manager.download_archive(session_id, path)
        return Response(data, media_type="application/x-tar")

    @app.post("/v1/sessions/{session_id}/verify", dependencies=auth, response_model=VerifyResult)
    async def verify_session(session_id: str, request: _VerifyRequest) -> VerifyResult:
        return await manager.verify(session_id, request.task_dir)

    return app


async def _body(request: Request, manager: SessionManager) -> bytes:
    limit = manager.config.max_file_bytes
    declared = int(request.headers.get("content-length") or 0)
    if declared > limit:
        raise InvalidSpec(f"upload of {declared} bytes exceeds the gateway's limit of {limit}")
    return await request.body()


class Gateway:
    """A configured gateway process: backend + session manager + app, served by uvicorn."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        host: str = "127.0.0.1"
        """Address to listen on."""
        port: int = 8700
        token: str | None = None
        """Bearer token clients must send (None: STACX_SANDBOX_TOKEN, else a generated one)."""
        auth: bool = True
        """Require the token; turning it off is for tests on a private loopback only."""
        backend: str = "docker"
        """`docker` or `process`."""
        sessions: SessionManager.Config = field(default_factory=SessionManager.Config)
        log_level: str = "info"

    def __init__(self, config: Config, *, backend: SandboxBackend | None = None) -> None:
        from sandbox.backends import build_backend

        self.config = config
        self.token = config.token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
        self.backend = backend or build_backend(config.backend)
        images = None
        if self.backend.name == "docker":
            from sandbox.images import TaskImageBuilder

            images = TaskImageBuilder()
        self.manager = SessionManager(config.sessions, self.backend, images=images)
        self.app = create_app(self.manager, token=self.token if config.auth else None)

    def run(self) -> None:
        """Serve until interrupted; every session is closed on the way out."""
        import uvicorn

        uvicorn.run(
            self.app,
            host=self.config.host,
            port=self.config.port,
            log_level=self.config.log_level,
            timeout_keep_alive=KEEP_ALIVE_S,
            backlog=4096,
        )
