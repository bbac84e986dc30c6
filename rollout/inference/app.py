"""The FastAPI application: SGLang native routes, OpenAI routes, health and metrics."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from rollout.inference import openai_routes
from rollout.inference.api import GenerateRequest, UpdateWeightsRequest
from rollout.inference.engine import BatchingEngine, GenerationOutput
from rollout.inference.errors import InferenceError, InvalidRequestError, WeightLoadError
from rollout.inference.sampling import SamplingParams
from rollout.inference.weight_files import check_state_dict, read_state_dict

__all__ = ["ServingState", "build_app"]


@dataclass(kw_only=True, slots=True)
class ServingState:
    """What the routes share: the engine, the tokenizer and what is loaded."""

    engine: BatchingEngine
    tokenizer: Any
    model_path: str
    served_model_name: str
    context_length: int
    swap_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def check_prompt(self, ids: list[int], params: SamplingParams, field_name: str, limit_name: str) -> None:
        """Raise `InvalidRequestError` naming the field for empty, out-of-vocab or long input."""
        if not ids:
            raise InvalidRequestError(field_name, "is empty; send at least one token")
        vocab = self.engine.model.config.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InvalidRequestError(
                field_name, f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})"
            )
        if len(ids) + params.max_new_tokens > self.context_length:
            raise InvalidRequestError(
                field_name,
                f"has {len(ids)} tokens and {limit_name}={params.max_new_tokens}; together they "
                f"exceed the context length {self.context_length}: shorten the prompt or lower "
                f"{limit_name}",
            )

    async def generate(self, ids: list[int], params: SamplingParams) -> GenerationOutput:
        return await asyncio.wrap_future(self.engine.submit(ids, params))


def _error_body(exc: InferenceError) -> dict[str, Any]:
    return {
        "error": {
            "message": str(exc),
            "type": type(exc).__name__,
            "param": getattr(exc, "field", None),
            "code": exc.status_code,
        }
    }


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InferenceError)
    async def _inference_error(_: Request, exc: InferenceError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.retriable else None
        return JSONResponse(_error_body(exc), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{_field_name(e['loc'])}: {e['msg']}" for e in exc.errors()]
        message = "; ".join(problems)
        return JSONResponse(
            {
                "error": {"message": message, "type": "RequestValidationError", "code": 422},
                "detail": jsonable_encoder(exc.errors()),
            },
            status_code=422,
        )


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc if part != "body") or "body"


class JsonBodyMiddleware:
    """Treat every POST body as JSON (`curl -d` sends form content-type), as SGLang users expect."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def _meta_info(out: GenerationOutput, rid: str, started: float, logprobs: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": 0,
        "weight_version": out.weight_version,
        "e2e_latency": time.monotonic() - started,
    }
    if logprobs:
        meta["output_token_logprobs"] = [
            [lp, tid, None] for lp, tid in zip(out.logprobs, out.output_ids, strict=True)
        ]
    return meta


def _generate_input(state: ServingState, body: GenerateRequest) -> list[int]:
    if body.text is not None and body.input_ids is not None:
        raise InvalidRequestError("input_ids", "send either text or input_ids, not both")
    if body.input_ids is not None:
        return body.input_ids
    if body.text:
        return list(state.tokenizer.encode(body.text, add_special_tokens=False))
    raise InvalidRequestError("input_ids", "text or input_ids is required and must not be empty")


def _install_native_routes(app: FastAPI, state: ServingState) -> None:
    @app.post("/generate")
    async def generate(body: GenerateRequest) -> dict[str, Any]:
        started = time.monotonic()
        ids = _generate_input(state, body)
        params = body.sampling_params.to_params()
        state.check_prompt(
            ids,
            params,
            "input_ids" if body.input_ids is not None else "text",
            "sampling_params.max_new_tokens",
        )
        out = await state.generate(ids, params)
        rid = body.rid or uuid.uuid4().hex
        return {
            "text": out.text,
            "output_ids": out.output_ids,
            "meta_info": _meta_info(out, rid, started, body.return_logprob),
        }

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        config = state.engine.model.config
        return {
            "model_path": state.model_path,
            "tokenizer_path": state.model_path,
            "is_generation": True,
            "weight_version": state.engine.weight_version,
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
            "served_model_name": state.served_model_name,
            "max_context_length": state.context_length,
        }

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsRequest) -> JSONResponse:
        try:
            aborted = await _swap_weights(state, body)
        except WeightLoadError as exc:
            return JSONResponse(
                {"success": False, "message": str(exc), **_error_body(exc)}, status_code=exc.status_code
            )
        return JSONResponse(
            {
                "success": True,
                "num_paused_requests": aborted,
                "message": f"loaded {body.model_path} as weight version {state.engine.weight_version}",
            }
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        alive = state.engine.is_alive()
        return JSONResponse({"status": "ok" if alive else "stopped"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.engine.metrics.render(), media_type="text/plain; version=0.0.4")


async def _swap_weights(state: ServingState, body: UpdateWeightsRequest) -> int:
    if not Path(body.model_path).is_dir():
        raise WeightLoadError(f"model_path {body.model_path} is not a directory on the server")
    async with state.swap_lock:
        model = state.engine.model
        device = next(model.parameters()).device
        tensors = await asyncio.to_thread(read_state_dict, body.model_path, device)
        update = await asyncio.to_thread(check_state_dict, model, tensors)
        version = body.weight_version or state.engine.weight_version
        aborted = await asyncio.wrap_future(
            state.engine.update_weights(update, version, body.abort_all_requests)
        )
        state.model_path = body.model_path
    return aborted


def build_app(state: ServingState) -> FastAPI:
    """The app serving `state` (the caller starts and stops the engine)."""
    app = FastAPI(title="stacx inference", docs_url=None, redoc_url=None)
    app.add_middleware(JsonBodyMiddleware)
    _install_error_handlers(app)
    _install_native_routes(app, state)
    openai_routes.install(app, state)
    return app
