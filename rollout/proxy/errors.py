"""Errors of the agent proxy: one root, `ProxyError`; `status_code` is what the client sees."""

from __future__ import annotations

__all__ = ["ProxyConfigError", "ProxyError", "UnsupportedRequestError", "UpstreamError"]


class ProxyError(Exception):
    """Root of every error raised by `stacx.rollout.proxy`."""

    retriable = False
    status_code = 500


class ProxyConfigError(ProxyError, ValueError):
    """A proxy setting is invalid; the message names the field and the fix."""


class UnsupportedRequestError(ProxyError):
    """The request asks for something the proxy does not forward (the message says what)."""

    status_code = 400

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UpstreamError(ProxyError):
    """The inference server failed, refused or is busy; `status_code` mirrors its answer."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 502,
        retry_after_s: float | None = None,
        unreachable: bool = False,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.unreachable = unreachable
        """The server could not be reached at all (the session may move to another one)."""
        self.retry_after_s = retry_after_s
        self.retriable = status_code in (429, 502, 503, 504)
