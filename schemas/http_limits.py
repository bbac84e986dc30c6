"""Limits where bytes enter our HTTP services (inference server, agent proxy, sandbox gateway).

One request must never take a service down, so each service bounds what a client can make it hold:

- `RequestLimits` (ASGI middleware): a body past the route's limit gets 413 naming the limit, counted
  while it streams (chunked uploads included) and never kept; a header longer than
  `max_header_bytes` gets 431 naming the header; a body that stops arriving for `read_timeout_s`
  gets 408. The error body is the service's own shape (`error_body`).
- `uvicorn_options()`: the same limits for the HTTP layer below the app: a connection that has not
  sent a whole request head within `read_timeout_s` is answered 408 and closed (half-open
  connections hold nothing for ever), and the head may not grow past `max_head_bytes`.

This lives in `schemas` because every service package may import it (ARCHITECTURE.md, "Layout").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["DEFAULT_READ_TIMEOUT_S", "ErrorBody", "HttpLimits", "RequestLimits", "uvicorn_options"]

DEFAULT_READ_TIMEOUT_S = 30.0
"""Longest wait for the next part of a request head or body."""

ErrorBody = Callable[[int, str, str], dict[str, Any]]
"""`(status, message, param) -> JSON body` in the service's own error shape."""


@dataclass(kw_only=True, slots=True)
class HttpLimits:
    """How much one request may make a service hold, and for how long."""

    max_body_bytes: int = 32 << 20
    """Largest request body; past it the answer is 413 and the rest is discarded unread."""
    max_header_bytes: int = 8 << 10
    """Largest single header (name and value); past it the answer is 431 naming the header."""
    max_head_bytes: int = 256 << 10
    """Largest request head (request line and all headers) the HTTP parser buffers."""
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    """Longest wait for the next part of a request head or body before answering 408."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "max_head_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"http limits: {name}={getattr(self, name)}; use a positive byte count")
        if not self.read_timeout_s > 0:
            raise ValueError(f"http limits: read_timeout_s={self.read_timeout_s}; use seconds > 0")


class _Refused(Exception):
    """Raised into the app from `receive()` once a request broke a limit (the answer is sent here)."""

    def __init__(self, status: int, message: str, param: str) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass(slots=True)
class _RequestState:
    """What one request sent so far, and whether it was refused or answered."""

    received: int = 0
    body_done: bool = False
    refused: _Refused | None = None
    started: bool = False


DRAIN_LIMIT_BYTES = 1 << 30
"""Most of a refused body read (and discarded) so the client reads the answer, not a reset."""


class RequestLimits:
    """ASGI middleware applying `HttpLimits` (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        *,
        limits: HttpLimits,
        error_body: ErrorBody,
        limit_for: Callable[[str, str], int] | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.error_body = error_body
        self.limit_for = limit_for or (lambda _method, _path: limits.max_body_bytes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self._check_head(scope)
        if refused is not None:
            await _drain(receive, self.limits.read_timeout_s)
            await self._answer(send, refused)
            return
        await self._guarded(scope, receive, send, self.limit_for(scope["method"], scope["path"]))

    def _check_head(self, scope: Any) -> _Refused | None:
        limit = self.limit_for(scope["method"], scope["path"])
        for name, value in scope.get("headers") or ():
            if len(name) + len(value) > self.limits.max_header_bytes:
                header = name[:64].decode("latin-1")
                return _Refused(
                    431,
                    f"header {header} is {len(value)} bytes; this service takes at most "
                    f"{self.limits.max_header_bytes} bytes per header",
                    header,
                )
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return _too_large(limit)
        return None

    async def _guarded(self, scope: Any, receive: Any, send: Any, limit: int) -> None:
        state = _RequestState()
        timeout = self.limits.read_timeout_s

        async def counted_receive() -> Any:
            if state.body_done:  # after the body: waiting for a disconnect has no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout)
            except TimeoutError:
                state.refused = _Refused(
                    408, f"the request body stopped arriving for {timeout:g}s; send it whole", "body"
                )
                raise state.refused from None
            if message["type"] == "http.request":
                state.received += len(message.get("body", b""))
                state.body_done = not message.get("more_body", False)
                if state.received > limit:
                    state.refused = _too_large(limit)
                    await _drain(receive, timeout, more_body=not state.body_done)
                    raise state.refused
            return message

        async def guarded_send(message: Any) -> None:
            if state.refused is not None:  # whatever the app answers to the aborted read
                if not state.started:
                    state.started = True
                    await self._answer(send, state.refused)
                return
            state.started = state.started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except _Refused as exc:
            if not state.started:
                state.started = True
                await self._answer(send, exc)

    async def _answer(self, send: Any, refused: _Refused) -> None:
        body = json.dumps(self.error_body(refused.status, refused.message, refused.param)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": refused.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _too_large(limit: int) -> _Refused:
    return _Refused(
        413,
        f"request body is larger than this route accepts ({limit} bytes); send less, or split it",
        "body",
    )


async def _drain(receive: Any, timeout_s: float, *, more_body: bool = True) -> None:
    """Read and drop the rest of a refused body (bounded in bytes and time), keeping nothing."""
    drained = 0
    try:
        while more_body and drained < DRAIN_LIMIT_BYTES:
            message = await asyncio.wait_for(receive(), timeout_s)
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            more_body = message.get("more_body", False)
    except TimeoutError:
        return


_HEAD_TIMEOUT_BODY = b'{"error": {"message": "request head not received in time", "code": 408}}'
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_HEAD_TIMEOUT_BODY), _HEAD_TIMEOUT_BODY)
)
"""The answer to a connection whose request head did not arrive in time (written raw: the
parser is mid-request, and the connection closes right after)."""


class _HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head does not arrive in time
    (uvicorn has no such timeout: a half-sent request would hold its connection for ever)."""

    head_timeout_s = 30.0

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        in_request = self.cycle is not None and not self.cycle.response_complete
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._cancel_head_timer()  # a whole head arrived: the body has its own timeout
        elif not in_request:
            self._arm_head_timer()  # the head of a (next) request is under way

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return
        if not self.transport.is_closing():
            self.transport.write(_REQUEST_TIMEOUT)
            self.transport.close()


def uvicorn_options(limits: HttpLimits) -> dict[str, Any]:
    """`uvicorn.Config` keyword arguments applying `limits` below the app (head size, head timeout)."""
    protocol = type("HeadTimeoutProtocol", (_HeadTimeoutProtocol,), {"head_timeout_s": limits.read_timeout_s})
    return {"http": protocol, "h11_max_incomplete_event_size": limits.max_head_bytes}
