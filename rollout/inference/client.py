"""`InferenceClient`: one async HTTP client for the built-in server and SGLang.

Retries with exponential backoff (honouring `Retry-After`) on connection errors and on 429/502/
503/504, which is what a server answers while it is busy, starting or swapping weights, and on
sglang-router's 500 for a request whose server died under it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry import propagate

from stacx.rollout.inference.errors import (
    InferenceError,
    InvalidRequestError,
    OverloadedError,
    ServerError,
    ServerUnavailableError,
)
from stacx.rollout.inference.sampling import SamplingParams

__all__ = ["GenerateResult", "InferenceClient", "ModelInfo"]

RETRY_STATUSES = frozenset({429, 502, 503, 504})
UPSTREAM_LOST = "call_upstream_request_error"
"""sglang-router's error code when the server a request went to failed under it."""


@dataclass(kw_only=True, slots=True)
class GenerateResult:
    """One `/generate` answer, typed."""

    output_ids: list[int]
    logprobs: list[float] | None
    """Per output token; None unless requested."""
    text: str
    weight_version: str
    finish_reason: str
    """`stop`, `length` or `abort`."""
    matched_stop: int | str | None
    prompt_tokens: int
    completion_tokens: int
    meta_info: dict[str, Any] = field(default_factory=dict)

    @property
    def policy_version(self) -> int | None:
        """`weight_version` as an int when it is one (STACX publishes integer versions)."""
        return int(self.weight_version) if self.weight_version.lstrip("-").isdigit() else None


@dataclass(kw_only=True, slots=True)
class ModelInfo:
    model_path: str
    weight_version: str
    raw: dict[str, Any] = field(default_factory=dict)


ALWAYS_SENT = ("max_new_tokens", "temperature", "top_p", "top_k", "ignore_eos", "skip_special_tokens")


def sampling_payload(params: SamplingParams) -> dict[str, Any]:
    """SGLang `sampling_params` JSON: the core fields, plus every other field that is not at its
    default (so an older SGLang never sees a key it does not know unless the caller set it)."""
    defaults = dataclasses.asdict(SamplingParams())
    payload = {
        key: value
        for key, value in dataclasses.asdict(params).items()
        if key in ALWAYS_SENT or value != defaults[key]
    }
    if "logit_bias" in payload:
        payload["logit_bias"] = {str(k): v for k, v in payload["logit_bias"].items()}
    return payload


def _parse_generate(body: dict[str, Any], want_logprobs: bool) -> GenerateResult:
    meta = body.get("meta_info", {})
    finish = meta.get("finish_reason") or {}
    entries = meta.get("output_token_logprobs") or []
    logprobs = [float(entry[0]) for entry in entries] if want_logprobs else None
    # Older SGLang releases omit `output_ids`; the logprob entries carry the ids too.
    output_ids = list(body.get("output_ids") or [int(entry[1]) for entry in entries])
    return GenerateResult(
        output_ids=output_ids,
        logprobs=logprobs,
        text=body.get("text", ""),
        weight_version=str(meta.get("weight_version", "")),
        finish_reason=str(finish.get("type", "unknown")),
        matched_stop=finish.get("matched"),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        meta_info=meta,
    )


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail"):
            if body.get(key):
                return str(body[key])
    return str(body)[:500]


class InferenceClient:
    """Async client of one inference server (built-in or SGLang)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        base_url: str
        """e.g. http://127.0.0.1:30000"""
        timeout_s: float = 600.0
        """Per HTTP call (a long generation holds the call open)."""
        max_retries: int = 8
        """Retries of one call on connection errors and 429/502/503/504."""
        backoff_initial_s: float = 0.1
        """First retry delay; doubles each retry (with jitter)."""
        backoff_max_s: float = 5.0
        """Cap on one retry delay."""

    def __init__(self, config: Config, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self._http = httpx.AsyncClient(
            base_url=config.base_url, timeout=config.timeout_s, transport=transport,
            event_hooks={"request": [_inject_trace_context]},
        )

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams | None = None, return_logprob: bool = True
    ) -> GenerateResult:
        """Generate from token ids; the result says which weight version produced it."""
        payload = {
            "input_ids": list(input_ids),
            "sampling_params": sampling_payload(sampling or SamplingParams()),
            "return_logprob": return_logprob,
        }
        body = await self._call("POST", "/generate", payload)
        return _parse_generate(body, return_logprob)

    async def score(self, input_ids: list[int], start: int) -> list[float]:
        """Logprobs of `input_ids[start:]` under the served model, each given the tokens before it
        (teacher forcing: SGLang's `logprob_start_len` and `input_token_logprobs`). 1 <= start."""
        if not 1 <= start < len(input_ids):
            raise ValueError(f"score: start={start} must be in [1, {len(input_ids) - 1}]")
        payload = {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": start,
        }
        body = await self._call("POST", "/generate", payload)
        entries = (body.get("meta_info") or {}).get("input_token_logprobs") or []
        values = [float(e[0]) for e in entries if e and e[0] is not None]
        return values[-(len(input_ids) - start):]

    async def get_model_info(self) -> ModelInfo:
        body = await self._call("GET", "/get_model_info")
        return ModelInfo(
            model_path=str(body.get("model_path", "")),
            weight_version=str(body.get("weight_version", "")),
            raw=body,
        )

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | int | None = None, abort_all_requests: bool = False
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"model_path": model_path, "abort_all_requests": abort_all_requests}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        return await self._call("POST", "/update_weights_from_disk", payload)

    async def abort_all(self) -> None:
        """End every request in flight (their answers say `abort`)."""
        await self._call("POST", "/abort_request", {"abort_all": True})

    async def health(self) -> bool:
        try:
            response = await self._http.get("/health")
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def _call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        delay = self.config.backoff_initial_s
        for attempt in range(self.config.max_retries + 1):
            last = attempt == self.config.max_retries
            try:
                response = await self._http.request(method, path, json=payload)
            except httpx.TransportError as exc:
                if last:
                    raise ServerUnavailableError(
                        f"{method} {self.config.base_url}{path} failed: {exc!r}"
                    ) from exc
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, self.config.backoff_max_s)
                continue
            if (response.status_code in RETRY_STATUSES or _upstream_lost(response)) and not last:
                wait = _retry_after(response) or delay * random.uniform(0.5, 1.0)
                await asyncio.sleep(min(wait, self.config.backoff_max_s))
                delay = min(delay * 2, self.config.backoff_max_s)
                continue
            return _checked(response, method, path)
        raise AssertionError("unreachable")  # the last attempt returns or raises


async def _inject_trace_context(request: httpx.Request) -> None:
    """W3C `traceparent` of the generate span on every request (none without an active span)."""
    propagate.inject(request.headers)


def _upstream_lost(response: httpx.Response) -> bool:
    """sglang-router's answer for a request whose server died under it (HTTP 500,
    `call_upstream_request_error`): safe to repeat, and the router sends it to a live server."""
    if response.status_code != 500:
        return False
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == UPSTREAM_LOST


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _checked(response: httpx.Response, method: str, path: str) -> dict[str, Any]:
    status = response.status_code
    if status < 400:
        body = response.json()
        if not isinstance(body, dict):
            raise ServerError(status, f"{method} {path} returned {type(body).__name__}, not JSON")
        return body
    message = f"{method} {path}: {_error_message(response)}"
    error: InferenceError
    if status == 429:
        error = OverloadedError(message)
    elif status in RETRY_STATUSES:
        error = ServerUnavailableError(message)
    elif status in (400, 422):
        error = InvalidRequestError(path, message)
    else:
        error = ServerError(status, message)
    raise error
