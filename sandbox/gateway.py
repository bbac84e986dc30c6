"""The sandbox gateway: FastAPI over a `SessionManager`, with bearer-token auth on by default.

Auth: the operator's (admin) token reaches every session; each client token reaches only the
sessions it created (another client's session answers 404). Request bodies are counted while they
stream in: past `max_file_bytes` (file and archive uploads) or `max_request_bytes` (everything
else) the request ends with 413 before the rest is read; an oversized header gets 431 and a stalled
request 408 (`stacx.schemas.http_limits`). A body that does not fit its model gets 422 naming the
field (NaN and Infinity included). No /docs, /redoc or /openapi.json.

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

import hashlib
import hmac
import inspect
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from opentelemetry import context as context_api
from opentelemetry import propagate, trace
from opentelemetry.trace.status import Status, StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, field_validator

from stacx.sandbox.errors import (
    AuthError,
    InvalidSpec,
    RequestTimeout,
    RequestTooLarge,
    SandboxError,
    SessionNotFound,
)
from stacx.sandbox.models import (
    ExecRequest,
    ExecResult,
    FileWritten,
    Health,
    SessionInfo,
    SessionSpec,
    VerifyResult,
)
from stacx.sandbox.protocols import SandboxBackend
from stacx.sandbox.sessions import SessionManager
from stacx.schemas.config import Port
from stacx.schemas.http_limits import DEFAULT_READ_TIMEOUT_S, HttpLimits, RequestLimits, uvicorn_options

__all__ = [
    "CLIENT_TOKENS_ENV",
    "DEFAULT_MAX_REQUEST_BYTES",
    "KEEP_ALIVE_S",
    "TOKEN_ENV",
    "Gateway",
    "Principal",
    "create_app",
]

TOKEN_ENV = "STACX_SANDBOX_TOKEN"
CLIENT_TOKENS_ENV = "STACX_SANDBOX_CLIENT_TOKENS"
"""Comma-separated client tokens, added to `Gateway.Config.client_tokens`."""
DEFAULT_MAX_REQUEST_BYTES = 16 << 20
"""Largest body of a JSON request (an exec's command, stdin and env)."""
KEEP_ALIVE_S = 75
"""Server keep-alive timeout, well above the client's keep-alive expiry (see SandboxClient)."""
VERSION = "1"
log = logging.getLogger(__name__)


class _VerifyRequest(BaseModel):
    task_dir: str | None = None

    @field_validator("task_dir")
    @classmethod
    def _a_path(cls, value: str | None) -> str | None:
        if value is not None and ("\0" in value or not value.encode("utf-8", "replace").decode() == value):
            raise ValueError("is not a path (it holds a NUL or a lone surrogate)")
        return value


def _error_json(exc: SandboxError) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "message": str(exc), "retriable": exc.retriable}}


def _error_response(exc: SandboxError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
    return JSONResponse(_error_json(exc), status_code=exc.status, headers=headers)


_LIMIT_ERRORS: dict[int, type[SandboxError]] = {
    408: RequestTimeout,
    413: RequestTooLarge,
    431: RequestTooLarge,
}


def _limit_error_body(status: int, message: str, _param: str) -> dict[str, Any]:
    """A refused request (`RequestLimits`) in the gateway's error shape."""
    return _error_json(_LIMIT_ERRORS.get(status, InvalidSpec)(message))


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    """A body that does not fit its model: 422 naming each field, never echoing the input (a NaN
    would make the answer itself invalid JSON)."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {error.get('msg')}")
    return _error_response(InvalidSpec("; ".join(problems) or "invalid request"))


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a request: the admin (the operator's token, or auth off) or one client."""

    admin: bool
    client: str | None = None
    """Digest of the client's token (never the token itself); None for the admin."""


ADMIN = Principal(admin=True)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:24]


def _auth_dependency(
    token: str | None, client_tokens: Iterable[str]
) -> Callable[[Request], Awaitable[Principal]]:
    admin = f"Bearer {token}".encode() if token else None
    clients = [(f"Bearer {t}".encode(), Principal(admin=False, client=_digest(t))) for t in client_tokens]

    async def check(request: Request) -> Principal:
        if admin is None:
            return ADMIN
        given = request.headers.get("authorization", "").encode()
        if hmac.compare_digest(given, admin):
            return ADMIN
        found = [p for expected, p in clients if hmac.compare_digest(given, expected)]
        if found:
            return found[0]
        raise AuthError("missing or wrong bearer token (Authorization: Bearer <token>)")

    return check


def _reach(manager: SessionManager, principal: Principal, session_id: str) -> str:
    """`session_id` if `principal` may use it; another client's session is 'not found'."""
    owner = manager.client_of(session_id)
    if not principal.admin and owner != principal.client:
        raise SessionNotFound(f"no session {session_id} for this token")
    return session_id


_FRAMEWORK_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "operation_spans": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI).parameters
    else {}
)
"""FastAPI versions with built-in telemetry would add their own spans beside `_TraceRequests`'
(five per request): off."""

_ACTIONS = {
    ("POST", "sessions"): "create",
    ("DELETE", "session"): "close",
    ("GET", "session"): "get",
}


def _span_name(method: str, path: str) -> str | None:
    """`gateway.exec`, `gateway.create`, ... for session routes; None for health and metrics."""
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2 or parts[:2] != ["v1", "sessions"]:
        return None
    if len(parts) == 2:
        return f"gateway.{_ACTIONS.get((method, 'sessions'), 'list')}"
    if len(parts) == 3:
        return f"gateway.{_ACTIONS.get((method, 'session'), method.lower())}"
    return f"gateway.{parts[3]}"


_TRACE_HEADER_NAMES = frozenset({b"traceparent", b"tracestate", b"baggage"})
"""The W3C trace context and baggage request headers (ASGI names are lower-case bytes)."""


class _TraceRequests:
    """ASGI middleware: a SERVER span per session request, continuing the caller's W3C
    `traceparent` (the rollout's episode). Passes requests straight through while no tracing SDK
    is installed."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._tracer: tuple[trace.TracerProvider, trace.Tracer | None] | None = None

    def _current_tracer(self) -> trace.Tracer | None:
        """The installed provider's tracer, made once per provider (None while tracing is off;
        the provider's class is checked once per provider, not per request)."""
        provider = trace.get_tracer_provider()
        if self._tracer is None or self._tracer[0] is not provider:
            off = isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
            self._tracer = (provider, None if off else provider.get_tracer("stacx.sandbox"))
        return self._tracer[1]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        name = _span_name(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        tracer = self._current_tracer() if name is not None else None
        if name is None or tracer is None:
            await self.app(scope, receive, send)
            return
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", ())
            if k in _TRACE_HEADER_NAMES
        }
        span = tracer.start_span(
            name,
            context=propagate.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
        )

        async def traced_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", int(message["status"]))
            await send(message)

        token = context_api.attach(trace.set_span_in_context(span))
        try:  # `trace.use_span` without its two generator context managers: cheaper per request
            await self.app(scope, receive, traced_send)
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            context_api.detach(token)
            span.end()


class _SessionCollector(Collector):
    """The session manager's figures, read at each scrape (`prometheus_client` exposition)."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        manager = self.manager
        yield GaugeMetricFamily("stacx_sandbox_sessions_active", "open sessions", value=len(manager.list()))
        yield GaugeMetricFamily(
            "stacx_sandbox_reusable", "warm sandboxes kept for reuse", value=manager.reusable
        )
        for name, value in sorted(manager.stats.items()):
            yield CounterMetricFamily(f"stacx_sandbox_{name.removesuffix('_total')}", name, value=value)


def _metrics_text(manager: SessionManager) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SessionCollector(manager))
    return generate_latest(registry).decode()


def create_app(
    manager: SessionManager,
    *,
    token: str | None,
    client_tokens: Iterable[str] = (),
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    manage_lifecycle: bool = True,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
) -> FastAPI:
    """The gateway app. `token` is the admin token (None disables auth: tests only);
    `client_tokens` each reach only their own sessions; the lifespan starts and stops `manager`
    unless `manage_lifecycle` is False."""

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

    app = FastAPI(
        title="STACX sandbox gateway",
        version=VERSION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        **_FRAMEWORK_TELEMETRY,
    )

    def limit_for(method: str, path: str) -> int:
        upload = method == "PUT" and path.endswith(("/files", "/archive"))
        return manager.config.max_file_bytes if upload else max_request_bytes

    limits = HttpLimits(max_body_bytes=max_request_bytes, read_timeout_s=read_timeout_s)
    app.add_middleware(RequestLimits, limits=limits, error_body=_limit_error_body, limit_for=limit_for)
    app.add_middleware(_TraceRequests)

    @app.exception_handler(SandboxError)
    async def sandbox_error(_request: Request, exc: SandboxError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc)

    caller_of = Depends(_auth_dependency(token, client_tokens))
    auth = [caller_of]

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

    @app.post("/v1/sessions", status_code=201, response_model=SessionInfo)
    async def create_session(spec: SessionSpec, caller: Principal = caller_of) -> SessionInfo:
        return await manager.create(spec, client=caller.client)

    @app.get("/v1/sessions", response_model=list[SessionInfo])
    async def list_sessions(caller: Principal = caller_of) -> list[SessionInfo]:
        sessions = manager.list()
        if caller.admin:
            return sessions
        return [s for s in sessions if manager.client_of(s.id) == caller.client]

    @app.get("/v1/sessions/{session_id}", response_model=SessionInfo)
    async def get_session(session_id: str, caller: Principal = caller_of) -> SessionInfo:
        return manager.get(_reach(manager, caller, session_id))

    @app.delete("/v1/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str, caller: Principal = caller_of) -> Response:
        await manager.close(_reach(manager, caller, session_id))
        return Response(status_code=204)

    @app.post("/v1/sessions/{session_id}/touch", response_model=SessionInfo)
    async def touch_session(session_id: str, caller: Principal = caller_of) -> SessionInfo:
        return manager.touch(_reach(manager, caller, session_id))

    @app.post("/v1/sessions/{session_id}/exec", response_model=ExecResult)
    async def exec_command(
        session_id: str, request: ExecRequest, caller: Principal = caller_of
    ) -> ExecResult:
        return await manager.exec(
            _reach(manager, caller, session_id),
            request.command,
            timeout_s=request.timeout_s,
            stdin=request.stdin,
            env=request.env,
            workdir=request.workdir,
            max_output_bytes=request.max_output_bytes,
        )

    @app.put("/v1/sessions/{session_id}/files", response_model=FileWritten)
    async def upload_file(
        session_id: str,
        request: Request,
        caller: Principal = caller_of,
        path: str = Query(...),
        mode: int = Query(0o644),
    ) -> FileWritten:
        session_id = _reach(manager, caller, session_id)
        return await manager.upload(session_id, path, await request.body(), mode=mode)

    @app.get("/v1/sessions/{session_id}/files")
    async def download_file(
        session_id: str, caller: Principal = caller_of, path: str = Query(...)
    ) -> Response:
        data = await manager.download(_reach(manager, caller, session_id), path)
        return Response(data, media_type="application/octet-stream")

    @app.put("/v1/sessions/{session_id}/archive", status_code=204)
    async def upload_archive(
        session_id: str, request: Request, caller: Principal = caller_of, path: str = Query(...)
    ) -> Response:
        session_id = _reach(manager, caller, session_id)
        await manager.upload_archive(session_id, path, await request.body())
        return Response(status_code=204)

    @app.get("/v1/sessions/{session_id}/archive")
    async def download_archive(
        session_id: str, caller: Principal = caller_of, path: str = Query(...)
    ) -> Response:
        data = await manager.download_archive(_reach(manager, caller, session_id), path)
        return Response(data, media_type="application/x-tar")

    @app.post("/v1/sessions/{session_id}/verify", response_model=VerifyResult)
    async def verify_session(
        session_id: str, request: _VerifyRequest, caller: Principal = caller_of
    ) -> VerifyResult:
        return await manager.verify(_reach(manager, caller, session_id), request.task_dir)

    return app


class Gateway:
    """A configured gateway process: backend + session manager + app, served by uvicorn."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        host: str = "127.0.0.1"
        """Address to listen on."""
        port: Port = 8700
        token: str | None = None
        """Admin bearer token, reaching every session (None: STACX_SANDBOX_TOKEN, else a
        generated one)."""
        client_tokens: tuple[str, ...] = ()
        """Client bearer tokens (plus those in STACX_SANDBOX_CLIENT_TOKENS): each reaches only
        the sessions created with it."""
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
        """Largest JSON request body; uploads are bounded by `sessions.max_file_bytes`."""
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
        """Longest wait for the next part of a request (head or body) before answering 408."""
        auth: bool = True
        """Require the token; turning it off is for tests on a private loopback only."""
        backend: str = "docker"
        """`docker` or `process`."""
        sessions: SessionManager.Config = field(default_factory=SessionManager.Config)
        python_dir: str | None = None
        """Host directory of Python installations that Harbor sandboxes see (read-only) at
        `stacx.sandbox.images.PYTHON_DIR` (`TaskImageBuilder.Config.python_dir`)."""
        log_level: str = "info"

        def __post_init__(self) -> None:
            if not 0 <= self.port <= 65535:
                raise ValueError(f"port = {self.port}; use 0..65535")
            if self.max_request_bytes < 1 or not self.read_timeout_s > 0:
                raise ValueError("max_request_bytes must be >= 1 and read_timeout_s > 0")

    def __init__(self, config: Config, *, backend: SandboxBackend | None = None) -> None:
        from stacx.sandbox.backends import build_backend

        self.config = config
        self.token = config.token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
        self.backend = backend or build_backend(config.backend)
        images = None
        if self.backend.name == "docker":
            from stacx.sandbox.images import TaskImageBuilder

            images = TaskImageBuilder(TaskImageBuilder.Config(python_dir=config.python_dir))
        self.manager = SessionManager(config.sessions, self.backend, images=images)
        from_env = [t for t in os.environ.get(CLIENT_TOKENS_ENV, "").split(",") if t.strip()]
        self.app = create_app(
            self.manager,
            token=self.token if config.auth else None,
            client_tokens=[*config.client_tokens, *(t.strip() for t in from_env)],
            max_request_bytes=config.max_request_bytes,
            read_timeout_s=config.read_timeout_s,
        )

    def _limits(self) -> HttpLimits:
        return HttpLimits(
            max_body_bytes=self.config.max_request_bytes, read_timeout_s=self.config.read_timeout_s
        )

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
            **uvicorn_options(self._limits()),
        )
