"""The FastAPI application: SGLang native routes, OpenAI routes, health and metrics.

Every error is a JSON body `{"error": {"message", "type", "param", "code"}}`: request validation
errors are 400 and name the field (values such as NaN are never echoed back, so the body is always
valid JSON), a body past the limit 413, a header past it 431, a stalled request 408
(`stacx.schemas.http_limits`), a failed request 500, a full queue 429 and a stopping engine 503.
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from stacx.rollout.inference import native_routes, openai_routes
from stacx.rollout.inference.errors import InferenceError
from stacx.rollout.inference.state import ClientDisconnected, ServingState
from stacx.schemas.http_limits import HttpLimits, RequestLimits

FRAMEWORK_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "operation_spans": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI).parameters
    else {}
)
"""FastAPI versions with built-in telemetry would add their own spans (five per request) beside
ours (`inference.generate`, `inference.swap_weights`, `proxy.chat`): off."""

__all__ = ["ServingState", "build_app", "error_body"]

log = logging.getLogger(__name__)


def _install_error_handlers(app: FastAPI, state: ServingState) -> None:
    metrics = state.engine.metrics

    def answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
        """The error response; a request refused as invalid (4xx but 429) is counted here (the
        engine counts the requests it failed)."""
        if 400 <= status < 500 and status != 429:
            metrics.inc("requests_invalid_total")
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(InferenceError)
    async def _inference_error(_: Request, exc: InferenceError) -> Response:
        if isinstance(exc, ClientDisconnected):
            return Response(status_code=exc.status_code)  # nobody is listening
        headers = {"Retry-After": "1"} if exc.retriable else None
        return answer(exc.status_code, native_routes.error_body(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _relevant(list(exc.errors()))
        problems = [_problem(e) for e in errors]
        first = _field_name(errors[0]["loc"]) if errors else None
        return answer(
            400,
            {
                "error": {
                    "message": "; ".join(problems),
                    "type": "invalid_request_error",
                    "param": first,
                    "code": 400,
                },
                "detail": [_safe_detail(e) for e in errors],
            },
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own answers (a body that is not UTF-8, an unknown route) in our shape."""
        status = exc.status_code
        unreadable = status == 400  # Starlette's only 400: the body could not be decoded
        error = {
            "message": unparsable_body(exc.__cause__) if unreadable else str(exc.detail),
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": "body" if unreadable else None,
            "code": status,
        }
        return answer(status, {"error": error}, dict(exc.headers or {}) or None)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        """A bug: one JSON error for the client, counted, the traceback in the server log."""
        log.error("request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        metrics.inc("requests_failed_total")
        error = {"message": f"internal error: {type(exc).__name__}: {exc}", "type": "server_error"}
        return answer(500, {"error": {**error, "param": None, "code": 500}})


def unparsable_body(cause: BaseException | None) -> str:
    """Why json.loads refused a body (FastAPI's one 400 keeps the reason as its cause)."""
    if isinstance(cause, RecursionError):
        reason = "it nests deeper than the parser allows"
    elif isinstance(cause, UnicodeDecodeError):
        reason = "it is not UTF-8 text"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        reason = "it holds an integer of more than 4300 digits"
    else:
        reason = str(cause) if cause is not None else "unknown reason"
    return f"body: is not valid JSON ({reason})"


def error_body(status: int, message: str, param: str) -> dict[str, Any]:
    """A request refused by `RequestLimits` (413, 431, 408) in the server's error shape."""
    return {
        "error": {
            "message": f"{param}: {message}",
            "type": "invalid_request_error",
            "param": param,
            "code": status,
        }
    }


def _relevant(errors: list[Any]) -> list[Any]:
    """The errors without "not a list"/"not an object" of the union branch the value did not
    take (`sampling_params` is an object or a list of them): they only confuse the message."""
    kept = [
        e
        for e in errors
        if not (e.get("loc") and _is_branch(e["loc"][-1]) and str(e.get("type")).endswith("_type"))
    ]
    return kept or errors


def _is_branch(part: Any) -> bool:
    """A union-branch label pydantic puts in a location (`list[SamplingParamsBody]`, a class)."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper())


def _problem(error: Any) -> str:
    """One line for a validation error; a body that is not JSON names where it breaks."""
    if error.get("type") == "json_invalid":
        at = error.get("loc", ("body", "?"))[-1]
        reason = (error.get("ctx") or {}).get("error") or error.get("msg")
        return f"body: is not valid JSON ({reason} at character {at})"
    return f"{_field_name(error['loc'])}: {error['msg']}"


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    """Dotted field name; union-branch labels pydantic adds (`list[int]`, class names) are dropped,
    and so is the character offset of a JSON syntax error (`("body", 15)` is the body)."""
    if len(loc) == 2 and loc[0] == "body" and isinstance(loc[1], int):
        return "body"
    parts = [str(part) for part in loc if part != "body"]
    parts = [p for p in parts if "[" not in p and not p[:1].isupper() and not p.startswith("function-")]
    return ".".join(parts) or "body"


def _safe_detail(error: Any) -> dict[str, Any]:
    """A validation error without the offending input, which may be NaN (not valid JSON)."""
    detail = {
        "type": error.get("type"),
        "loc": [str(p) for p in error.get("loc", ())],
        "msg": error.get("msg"),
    }
    value = error.get("input")
    if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
        detail["input"] = value
    return detail


class JsonBodyMiddleware:
    """Treat every POST body as JSON (`curl -d` sends form content-type), as SGLang users expect."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def _install_service_routes(app: FastAPI, state: ServingState) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        if not state.engine.is_alive():
            return JSONResponse({"status": "stopped"}, status_code=503)
        if state.not_ready is not None:
            return JSONResponse({"status": "starting", "message": state.not_ready}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.engine.metrics.render(), media_type="text/plain; version=0.0.4")


def build_app(state: ServingState, limits: HttpLimits | None = None) -> FastAPI:
    """The app serving `state` (the caller starts and stops the engine); `limits` bound each
    request's body, headers and read time."""
    app = FastAPI(title="stacx inference", docs_url=None, redoc_url=None, **FRAMEWORK_TELEMETRY)
    app.add_middleware(JsonBodyMiddleware)
    app.add_middleware(RequestLimits, limits=limits or HttpLimits(), error_body=error_body)
    _install_error_handlers(app, state)
    _install_service_routes(app, state)
    native_routes.install(app, state)
    openai_routes.install(app, state)
    return app
