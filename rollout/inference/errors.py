"""Errors of the inference package (server, engine and client share one root).

`retriable` says whether the same call may succeed later unchanged (backpressure, a weight swap,
a server still starting); `status_code` is the HTTP status the server answers with.
"""

from __future__ import annotations

__all__ = [
    "EngineStoppedError",
    "InferenceError",
    "InvalidRequestError",
    "OverloadedError",
    "RequestFailedError",
    "ServerError",
    "ServerUnavailableError",
    "WeightLoadError",
]


class InferenceError(Exception):
    """Root of every error raised by `stacx.rollout.inference`."""

    retriable = False
    status_code = 500


class InvalidRequestError(InferenceError):
    """The request cannot be served as given (empty input, too many tokens, bad value)."""

    status_code = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        """Dotted name of the offending request field."""


class RequestFailedError(InferenceError):
    """Serving this one request failed (its prefill, decode or sampling raised); others go on."""

    status_code = 500


class OverloadedError(InferenceError):
    """Too many requests are waiting; retry after a short delay (HTTP 429)."""

    retriable = True
    status_code = 429


class ServerUnavailableError(InferenceError):
    """The server is starting, stopping or swapping weights (HTTP 503), or unreachable."""

    retriable = True
    status_code = 503


class EngineStoppedError(ServerUnavailableError):
    """The batching engine was stopped before the request finished."""


class WeightLoadError(InferenceError):
    """New weights could not be read or do not fit the loaded model (names, shapes)."""

    status_code = 400


class ServerError(InferenceError):
    """The server answered with an error the client cannot fix by retrying."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
