"""Async client of the sandbox gateway (what the rollout engine uses).

    async with SandboxClient(SandboxClient.Config(base_url=url, token=token)) as client:
        async with client.session(SessionSpec(image="stacx/sandbox:bookworm")) as session:
            result = await client.exec(session.id, "python3 -c 'print(1)'", timeout_s=10)

Errors come back as the gateway raised them (`stacx.sandbox.errors`), e.g. `SessionNotFound`.

Calls that are safe to repeat (session start, reads, uploads, close) are retried with bounded
exponential backoff when the gateway cannot be reached (connection refused or reset) or answers
502/503 (`Config.max_retries`); `exec` and `verify_remote` run commands and are never retried.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from opentelemetry import propagate
from pydantic import BaseModel, ValidationError

from stacx.sandbox.errors import BackendError, InvalidSpec, SandboxError, SessionNotFound, error_class
from stacx.sandbox.models import (
    ExecRequest,
    ExecResult,
    FileWritten,
    Health,
    SessionInfo,
    SessionSpec,
    VerifyResult,
)
from stacx.sandbox.paths import tar_directory
from stacx.sandbox.tasks import HarborTask, load_task
from stacx.sandbox.verifier import run_oracle, verify

__all__ = ["SandboxClient"]

_EXEC_SLACK_S = 30.0
"""HTTP timeout of an exec beyond its own timeout (queueing, process start, transfer)."""

_RETRY_STATUSES = frozenset({502, 503})
_DEGRADED = frozenset({503})
"""/healthz of a degraded gateway: a Health body with `problem`."""
"""Answers after which a retry-safe call is repeated (backend failure, capacity or proxy)."""

_RETRY_TRANSPORT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
"""Connection refused or reset; read and pool timeouts are not retried (the gateway may be busy
with the very request, e.g. building an image)."""


class SandboxClient:
    """Talks to one gateway; safe to share between many concurrent coroutines."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        base_url: str
        """Gateway address, e.g. http://127.0.0.1:8700."""
        token: str | None = None
        """Bearer token (the gateway's STACX_SANDBOX_TOKEN)."""
        timeout_s: float = 120.0
        """HTTP timeout of calls other than exec (session start may build an image)."""
        max_connections: int = 512
        """Connection pool size; allow one per concurrent session."""
        keepalive_expiry_s: float = 5.0
        """Drop idle connections after this long; keep it below the gateway's keep-alive timeout
        (stacx.sandbox.gateway.KEEP_ALIVE_S) so a request never races the server closing it."""
        transport: httpx.AsyncBaseTransport | None = None
        """Custom transport (e.g. `httpx.ASGITransport(app)` to call a gateway in-process)."""
        max_retries: int = 3
        """Retries of a retry-safe call after a connection error or a 502/503 (0 disables)."""
        retry_backoff_s: float = 0.2
        """Delay before the first retry; doubled for each further one (with jitter)."""
        retry_backoff_max_s: float = 5.0
        """Upper bound of one retry delay."""

    def __init__(self, config: Config) -> None:
        _validate(config)
        self.config = config
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        limits = httpx.Limits(
            max_connections=config.max_connections,
            max_keepalive_connections=config.max_connections,
            keepalive_expiry=config.keepalive_expiry_s,
        )
        self._http = httpx.AsyncClient(
            base_url=config.base_url,
            headers=headers,
            timeout=config.timeout_s,
            limits=limits,
            transport=config.transport,
            event_hooks={"request": [_inject_trace_context]},
        )

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (sessions stay open)."""
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        url: str,
        *,
        retry: bool = False,
        accept: frozenset[int] = frozenset(),
        **kwargs: Any,
    ) -> httpx.Response:
        """One call; with `retry=True` (only for calls safe to repeat) connection errors and
        502/503 answers are retried up to `Config.max_retries` times. Statuses in `accept` are
        answers, not errors."""
        attempts = 1 + (self.config.max_retries if retry else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = await self._http.request(method, url, **kwargs)
            except _RETRY_TRANSPORT_ERRORS as exc:
                if last:
                    raise self._unreachable(method, url, exc, attempts) from exc
            except httpx.TimeoutException as exc:
                raise BackendError(f"{method} {url}: the gateway did not answer in time ({exc})") from exc
            except httpx.TransportError as exc:
                raise self._unreachable(method, url, exc, attempt + 1) from exc
            else:
                if response.is_success or response.status_code in accept:
                    return response
                if last or response.status_code not in _RETRY_STATUSES:
                    raise _error_from(response)
            await asyncio.sleep(_backoff_delay(self.config, attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _unreachable(self, method: str, url: str, exc: Exception, attempts: int) -> BackendError:
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        return BackendError(
            f"{method} {url}: cannot reach the gateway at {self.config.base_url}{tries} "
            f"({type(exc).__name__}: {exc})"
        )

    # -- sessions --------------------------------------------------------------------------------
    async def health(self) -> Health:
        """The gateway's health; a degraded gateway (503) answers with `problem` set, not an error."""
        response = await self._request("GET", "/healthz", retry=True, accept=_DEGRADED)
        return Health.model_validate(response.json())

    async def answers(self) -> bool:
        """Whether the gateway answers `/healthz` now (degraded included), without retrying."""
        try:
            await self._request("GET", "/healthz", accept=_DEGRADED)
        except SandboxError:
            return False
        return True

    async def metrics(self) -> str:
        return (await self._request("GET", "/metrics", retry=True)).text

    async def create_session(self, spec: SessionSpec | None = None, **fields: Any) -> SessionInfo:
        """Start a session; pass a `SessionSpec` or its fields (`image=`, `task_dir=`, ...)."""
        spec = spec or _model(SessionSpec, fields)
        body = spec.model_dump(exclude_none=True)
        response = await self._request("POST", "/v1/sessions", json=body, retry=True)
        return SessionInfo.model_validate(response.json())

    async def get_session(self, session_id: str) -> SessionInfo:
        response = await self._request("GET", f"/v1/sessions/{session_id}", retry=True)
        return SessionInfo.model_validate(response.json())

    async def list_sessions(self) -> list[SessionInfo]:
        response = await self._request("GET", "/v1/sessions", retry=True)
        return [SessionInfo.model_validate(s) for s in response.json()]

    async def touch_session(self, session_id: str) -> SessionInfo:
        """Restart the session's idle timeout (keep a quiet long-lived session alive)."""
        response = await self._request("POST", f"/v1/sessions/{session_id}/touch", retry=True)
        return SessionInfo.model_validate(response.json())

    async def close_session(self, session_id: str, *, missing_ok: bool = True) -> None:
        """Close a session (already closed or expired is fine unless `missing_ok=False`)."""
        try:
            await self._request("DELETE", f"/v1/sessions/{session_id}", retry=True)
        except SessionNotFound:
            if not missing_ok:
                raise

    @asynccontextmanager
    async def session(self, spec: SessionSpec | None = None, **fields: Any) -> AsyncIterator[SessionInfo]:
        """A session closed on exit, whatever happens inside."""
        info = await self.create_session(spec, **fields)
        try:
            yield info
        finally:
            await self.close_session(info.id)

    # -- operations -----------------------------------------------------------------------------
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
        """Run `command` with `bash -c`; a timeout is a result (`timed_out=True`), not an error."""
        fields = {
            "command": command,
            "timeout_s": timeout_s,
            "stdin": stdin,
            "env": env or {},
            "workdir": workdir,
            "max_output_bytes": max_output_bytes,
        }
        request = _model(ExecRequest, fields)
        response = await self._request(
            "POST",
            f"/v1/sessions/{session_id}/exec",
            json=request.model_dump(exclude_none=True),
            timeout=timeout_s + _EXEC_SLACK_S,
        )
        return ExecResult.model_validate(response.json())

    async def upload(
        self, session_id: str, path: str, data: bytes | str, *, mode: int = 0o644
    ) -> FileWritten:
        """Write one file (relative paths are under the session workdir)."""
        content = data.encode() if isinstance(data, str) else data
        response = await self._request(
            "PUT",
            f"/v1/sessions/{session_id}/files",
            params={"path": path, "mode": mode},
            content=content,
            retry=True,
        )
        return FileWritten.model_validate(response.json())

    async def upload_archive(self, session_id: str, dest: str, data: bytes) -> None:
        """Extract a tar archive of plain files and directories into directory `dest`."""
        await self._request(
            "PUT", f"/v1/sessions/{session_id}/archive", params={"path": dest}, content=data, retry=True
        )

    async def upload_dir(self, session_id: str, local_dir: str | Path, dest: str) -> None:
        """Copy a local directory's content into `dest`."""
        await self.upload_archive(session_id, dest, tar_directory(Path(local_dir)))

    async def download(self, session_id: str, path: str) -> bytes:
        """Bytes of one file; `SandboxFileNotFound` when it does not exist."""
        response = await self._request(
            "GET", f"/v1/sessions/{session_id}/files", params={"path": path}, retry=True
        )
        return response.content

    async def download_archive(self, session_id: str, path: str) -> bytes:
        """A tar archive of a directory."""
        response = await self._request(
            "GET", f"/v1/sessions/{session_id}/archive", params={"path": path}, retry=True
        )
        return response.content

    # -- Harbor tasks ----------------------------------------------------------------------------
    async def verify(self, session_id: str, task: HarborTask | str | Path) -> VerifyResult:
        """Run the task's tests/test.sh in the session and return the reward (tests uploaded from
        this machine; for a task directory only the gateway host has, use `verify_remote`)."""
        loaded = task if isinstance(task, HarborTask) else load_task(task)
        return await verify(self, session_id, loaded)

    async def verify_remote(self, session_id: str, task_dir: str | None = None) -> VerifyResult:
        """Gateway-side verification (default: the task the session was created from)."""
        body = {"task_dir": task_dir} if task_dir else {}
        response = await self._request("POST", f"/v1/sessions/{session_id}/verify", json=body)
        return VerifyResult.model_validate(response.json())

    async def run_oracle(self, session_id: str, task: HarborTask | str | Path) -> ExecResult:
        """Apply the task's solution/solve.sh in the session."""
        loaded = task if isinstance(task, HarborTask) else load_task(task)
        return await run_oracle(self, session_id, loaded)


async def _inject_trace_context(request: httpx.Request) -> None:
    """W3C `traceparent` of the caller's span on every request (none without an active span),
    so the gateway's spans join the episode's trace."""
    propagate.inject(request.headers)


def _backoff_delay(config: SandboxClient.Config, attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (0-based): exponential, capped at
    `retry_backoff_max_s`, with jitter in its upper half so that many clients do not retry in step."""
    ceiling = min(config.retry_backoff_max_s, config.retry_backoff_s * 2.0**attempt)
    return ceiling * random.uniform(0.5, 1.0)


def _validate(config: SandboxClient.Config) -> None:
    if not config.base_url.startswith(("http://", "https://")):
        raise InvalidSpec(
            f"SandboxClient.Config.base_url must start with http:// or https://, got {config.base_url!r}"
        )
    if config.max_retries < 0:
        raise InvalidSpec(
            f"SandboxClient.Config.max_retries must be >= 0 (0 disables), got {config.max_retries}"
        )
    if config.retry_backoff_s < 0 or config.retry_backoff_max_s < config.retry_backoff_s:
        raise InvalidSpec(
            "SandboxClient.Config needs 0 <= retry_backoff_s <= retry_backoff_max_s, got "
            f"{config.retry_backoff_s} and {config.retry_backoff_max_s}"
        )


M = TypeVar("M", bound=BaseModel)


def _model(cls: type[M], fields: dict[str, Any]) -> M:
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise InvalidSpec(f"invalid {cls.__name__}: {exc}") from exc


def _error_from(response: httpx.Response) -> SandboxError:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return error_class(str(error.get("type")))(str(error.get("message")))
    if response.status_code == 422:
        return InvalidSpec(f"the gateway rejected the request: {response.text[:1000]}")
    return SandboxError(f"gateway answered {response.status_code}: {response.text[:500]}")
