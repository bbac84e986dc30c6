"""SGLang's native API in front of one vLLM server, so vLLM plugs in where any STACX server does.

Everything STACX drives speaks SGLang's API (the rollout client, the weight follower, the agent
proxy, `sglang-router`), so the vLLM engine is served as: vLLM (its own venv, its own port) plus
this app on the configured port. It maps `/generate` (token ids in, ids and logprobs out) onto
vLLM's `/v1/completions`, and `/update_weights_from_disk` onto vLLM's RL path: pause, the
`reload_weights` RPC, `/update_weight_version`, resume. `VersionGate` makes every answer carry
the version it was sampled under: a swap waits until the generations in flight are done (or
aborts them with `abort_all_requests`) and holds new ones until the new weights are in.
OpenAI routes (`/v1/...`) pass through to vLLM unchanged except `seed`, which is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from stacx.rollout.inference.api import AbortRequest, GenerateRequest, NativeItem, UpdateWeightsRequest
from stacx.rollout.inference.client import GenerateResult
from stacx.rollout.inference.errors import InferenceError, InvalidRequestError
from stacx.rollout.inference.native_routes import error_body
from stacx.rollout.inference.sampling import SamplingParams
from stacx.rollout.inference.vllm import VLLMClient, VLLMServer

__all__ = ["BridgeState", "VLLMEngine", "VersionGate", "build_bridge_app", "swap_weights"]

log = logging.getLogger(__name__)


class VersionGate:
    """Generations share the current version; a swap waits for them to end and holds new ones."""

    def __init__(self, version: str) -> None:
        self.version = version
        self._active = 0
        self._swapping = False
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def generation(self) -> AsyncIterator[str]:
        """Yields the version this generation runs under (constant until it ends)."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swapping)
            self._active += 1
            version = self.version
        try:
            yield version
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def swap(self) -> AsyncIterator[None]:
        """Exclusive: entered once no generation runs; none starts until it exits."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swapping)
            self._swapping = True
        try:
            yield
        finally:
            async with self._cond:
                self._swapping = False
                self._cond.notify_all()

    async def drained(self) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self._active == 0)

    @property
    def active(self) -> int:
        return self._active


@dataclass(kw_only=True, slots=True)
class BridgeState:
    vllm: VLLMClient
    gate: VersionGate
    model_path: str
    served_model_name: str
    vocab_size: int
    not_ready: str | None = None
    """Why /health answers 503 (waiting for the newest weights); None: ready."""


def _sglang_answer(item: NativeItem, result: GenerateResult, rid: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": {"type": result.finish_reason, "matched": result.matched_stop},
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cached_tokens": 0,
        "weight_version": result.weight_version,
    }
    if item.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(result.logprobs or [], result.output_ids, strict=True)
        ]
    return {"text": result.text, "output_ids": result.output_ids, "meta_info": meta}


def _item_params(state: BridgeState, item: NativeItem) -> SamplingParams:
    if item.input_ids is None:
        raise InvalidRequestError(item.field, "the vLLM engine takes prompts as input_ids; tokenize first")
    if item.logprob_start_len >= 0 or item.top_logprobs_num > 0:
        raise InvalidRequestError("logprob_start_len", "the vLLM engine serves no prompt or top logprobs")
    return item.sampling.to_params(state.vocab_size, f"{item.field} sampling_params.")


async def _generate(state: BridgeState, body: GenerateRequest) -> Any:
    if body.stream:
        raise InvalidRequestError("stream", "the vLLM engine's /generate does not stream; use /v1/...")
    items = body.items()
    params = [_item_params(state, item) for item in items]
    async with state.gate.generation() as version:
        results = await asyncio.gather(*(
            state.vllm.complete(item.input_ids or [], p, item.return_logprob, version)
            for item, p in zip(items, params, strict=True)
        ))
    answers = [
        _sglang_answer(item, r, item.rid or uuid.uuid4().hex) for item, r in zip(items, results, strict=True)
    ]
    return answers if body.is_batch else answers[0]


async def swap_weights(state: BridgeState, body: UpdateWeightsRequest) -> None:
    """vLLM's RL path under the gate: (abort,) drain, pause, reload, set the version, resume."""
    async with state.gate.swap():
        if body.abort_all_requests:
            await state.vllm.pause("abort")
        await state.gate.drained()
        await state.vllm.pause("wait")
        try:
            await state.vllm.reload_weights(body.model_path)
            version = body.weight_version or state.gate.version
            await state.vllm.set_weight_version(version)
            state.gate.version = version
            state.model_path = body.model_path
        finally:
            await state.vllm.resume()


def _error(exc: InferenceError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status_code)


def _install_native(app: FastAPI, state: BridgeState) -> None:
    @app.post("/generate")
    async def generate(body: GenerateRequest) -> Any:
        try:
            return await _generate(state, body)
        except InferenceError as exc:
            return _error(exc)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": state.model_path, "tokenizer_path": state.model_path, "is_generation": True,
                "weight_version": state.gate.version, "served_model_name": state.served_model_name,
                "engine": "vllm"}

    @app.get("/get_weight_version")
    async def weight_version() -> dict[str, Any]:
        return {"weight_version": state.gate.version}

    @app.post("/update_weights_from_disk")
    async def update_weights(body: UpdateWeightsRequest) -> JSONResponse:
        try:
            await swap_weights(state, body)
        except InferenceError as exc:
            return JSONResponse({"success": False, "message": str(exc), **error_body(exc)},
                                status_code=exc.status_code)
        return JSONResponse({"success": True, "message": f"loaded {body.model_path} as weight version "
                                                         f"{state.gate.version}"})

    @app.post("/abort_request")
    async def abort_request(body: AbortRequest) -> Any:
        if not body.abort_all:
            return _error(InvalidRequestError("rid", "the vLLM engine aborts all at once; send abort_all"))
        await state.vllm.abort_all()
        return {"success": True}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        await state.vllm.reset_prefix_cache()
        return Response("Cache flushed.\n")


def _install_health(app: FastAPI, state: BridgeState) -> None:
    @app.get("/health")
    async def health() -> Response:
        if state.not_ready is not None:
            return JSONResponse({"status": "starting", "message": state.not_ready}, status_code=503)
        ok = await state.vllm.health()
        return Response(status_code=200 if ok else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        params = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
        try:
            async with state.gate.generation() as version:
                await state.vllm.complete([state.vocab_size - 1], params, False, version)
        except InferenceError as exc:
            return JSONResponse({"status": "unhealthy", "message": str(exc)}, status_code=503)
        return Response(status_code=200)


def _install_openai(app: FastAPI, state: BridgeState) -> None:
    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def passthrough(path: str, request: Request) -> Response:
        raw = await request.body()
        if raw:
            payload = json.loads(raw)
            if isinstance(payload, dict):
                payload.pop("seed", None)  # vLLM-CPU dies on batches of seeded requests
                raw = json.dumps(payload).encode()
        try:
            async with state.gate.generation():
                answer = await state.vllm.forward(request.method, f"/v1/{path}", raw)
        except InferenceError as exc:
            return _error(exc)
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type"))


def build_bridge_app(state: BridgeState) -> FastAPI:
    """The FastAPI app serving SGLang's API over `state.vllm`."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await state.vllm.close()

    app = FastAPI(title="stacx vLLM engine", lifespan=lifespan)
    _install_native(app, state)
    _install_health(app, state)
    _install_openai(app, state)
    return app


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _vocab_size(model_path: str) -> int:
    config = json.loads(Path(model_path, "config.json").read_text())
    return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 0))


class VLLMEngine:
    """`engine: vllm`: vLLM on a private port plus this bridge on the configured one."""

    def __init__(self, server: VLLMServer.Config, *, host: str, port: int, weight_version: str,
                 wait_for_weights: bool = False) -> None:
        server.port = server.port or _free_port(host)
        self.vllm = VLLMServer(server)
        self.host, self.port, self.weight_version = host, port, weight_version
        name = server.served_model_name or server.model_path
        self.state = BridgeState(
            vllm=VLLMClient(self.vllm.base_url, name),
            gate=VersionGate(weight_version), model_path=server.model_path, served_model_name=name,
            vocab_size=_vocab_size(server.model_path),
            not_ready="loading the newest weight version" if wait_for_weights else None,
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def mark_weights_current(self) -> None:
        self.state.not_ready = None

    def serve(self) -> int:
        """Start vLLM, set its version, serve the bridge until SIGINT/SIGTERM or vLLM dies (1)."""
        self.vllm.start()
        try:
            self.vllm.wait_ready()
            httpx.post(f"{self.vllm.base_url}/update_weight_version",
                       json={"new_version": self.weight_version}, timeout=30).raise_for_status()
            app = build_bridge_app(self.state)
            server = uvicorn.Server(
                uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False)
            )
            watchdog = threading.Thread(target=self._watch, args=(server,), daemon=True)
            watchdog.start()
            server.run()
            return 0 if self.vllm.alive() else 1
        finally:
            self.vllm.stop()

    def _watch(self, server: uvicorn.Server) -> None:
        """vLLM died: stop serving, so supervision restarts the whole engine."""
        while not server.should_exit:
            if not self.vllm.alive():
                log.error("vLLM exited; stopping the engine (supervision restarts it)")
                server.should_exit = True
                return
            time.sleep(0.5)
