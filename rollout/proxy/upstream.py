"""Calls to one inference server's native `/generate` (SGLang API): exact token ids and logprobs.

The proxy renders prompts itself and sends `input_ids`, so the ids it records are exactly the
ids the model saw; `return_logprob` gives the sampled tokens' logprobs; `meta_info.weight_version`
says which weights produced the answer (a request never mixes two versions).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from stacx.rollout.proxy.errors import UpstreamError

__all__ = ["Generation", "UpstreamClient", "parse_generation"]


@dataclass(kw_only=True, slots=True)
class Generation:
    """One `/generate` answer (final, or cumulative so far when streaming)."""

    output_ids: list[int]
    logprobs: list[float]
    text: str
    weight_version: str
    finish_reason: dict[str, Any] | None
    """None while a stream is still running."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    meta_info: dict[str, Any] = field(default_factory=dict)

    @property
    def finish_type(self) -> str:
        return str((self.finish_reason or {}).get("type", "stop"))


def parse_generation(body: dict[str, Any]) -> Generation:
    meta = body.get("meta_info") or {}
    entries = meta.get("output_token_logprobs") or []
    ids = body.get("output_ids")
    return Generation(
        output_ids=[int(i) for i in ids] if ids is not None else [int(e[1]) for e in entries],
        logprobs=[float(e[0]) for e in entries],
        text=str(body.get("text", "")),
        weight_version=str(meta.get("weight_version", "")),
        finish_reason=meta.get("finish_reason"),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0)),
        meta_info=meta,
    )


class UpstreamClient:
    """Async HTTP to the inference servers (one pooled client for all of them)."""

    def __init__(self, timeout_s: float = 600.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = httpx.AsyncClient(timeout=timeout_s, transport=transport)

    async def close(self) -> None:
        await self._http.aclose()

    async def generate(self, base_url: str, payload: dict[str, Any]) -> Generation:
        """One non-streaming `/generate`; raises `UpstreamError` (transport errors: status 502)."""
        try:
            response = await self._http.post(f"{base_url}/generate", json={**payload, "stream": False})
        except httpx.TransportError as exc:
            raise UpstreamError(
                f"{base_url} unreachable: {exc!r}", status_code=502, unreachable=True
            ) from exc
        _check(response, base_url)
        body = response.json()
        if isinstance(body, list):  # n > 1 answers a list; the proxy sends one sample per call
            body = body[0]
        return parse_generation(body)

    async def stream(self, base_url: str, payload: dict[str, Any]) -> AsyncIterator[Generation]:
        """Open a streaming `/generate` (errors raise before the first item) and yield the
        cumulative answer after each event."""
        request = self._http.build_request("POST", f"{base_url}/generate", json={**payload, "stream": True})
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise UpstreamError(
                f"{base_url} unreachable: {exc!r}", status_code=502, unreachable=True
            ) from exc
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            _check(response, base_url)
        return _events(response, base_url)


async def _events(response: httpx.Response, base_url: str) -> AsyncIterator[Generation]:
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            body = json.loads(data)
            if "error" in body:
                error = body["error"] if isinstance(body["error"], dict) else {"message": body["error"]}
                raise UpstreamError(
                    f"{base_url}: {error.get('message')}", status_code=int(error.get("code") or 502)
                )
            yield parse_generation(body)
    except httpx.TransportError as exc:
        raise UpstreamError(f"{base_url} stream broke: {exc!r}", status_code=502) from exc
    finally:
        await response.aclose()


def _check(response: httpx.Response, base_url: str) -> None:
    status = response.status_code
    if status < 400:
        return
    try:
        body = response.json()
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    message = message or response.text[:300]
    retry_after: float | None = None
    try:
        retry_after = float(response.headers.get("retry-after", ""))
    except ValueError:
        retry_after = 1.0 if status in (429, 503) else None
    raise UpstreamError(
        f"{base_url} answered {status}: {message}", status_code=status, retry_after_s=retry_after
    )
