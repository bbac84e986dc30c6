"""SGLang native routes: `/generate` (single, batch, n, streaming), model/server info, weight
updates, cache flush, aborts and a generation health check."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from opentelemetry import propagate
from opentelemetry.trace import SpanKind

from stacx.producers.tracing import span
from stacx.rollout.inference.api import AbortRequest, GenerateRequest, NativeItem, UpdateWeightsRequest
from stacx.rollout.inference.errors import InferenceError, InvalidRequestError, WeightLoadError
from stacx.rollout.inference.job import GenerationOutput, RequestOptions, StreamChunk, TopLogprobs
from stacx.rollout.inference.sampling import SamplingParams
from stacx.rollout.inference.state import Generation, ServingState
from stacx.rollout.inference.weight_files import check_state_dict, read_state_dict

__all__ = ["error_body", "install"]


def error_body(exc: InferenceError) -> dict[str, Any]:
    return {
        "error": {
            "message": str(exc),
            "type": type(exc).__name__,
            "param": getattr(exc, "field", None),
            "code": exc.status_code,
        }
    }


def _entry(state: ServingState, logprob: float | None, token: int, with_text: bool) -> list[Any]:
    text = state.tokenizer.decode([token], skip_special_tokens=False) if with_text else None
    return [logprob, token, text]


def _top_entries(state: ServingState, tops: list[TopLogprobs | None], with_text: bool) -> list[Any]:
    return [None if top is None else [_entry(state, lp, t, with_text) for lp, t in top] for top in tops]


def _meta_info(
    state: ServingState, item: NativeItem, out: GenerationOutput, rid: str, started: float, with_text: bool
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": out.cached_tokens,
        "weight_version": out.weight_version,
        "e2e_latency": time.monotonic() - started,
    }
    if not item.return_logprob:
        return meta
    meta["output_token_logprobs"] = [
        _entry(state, lp, t, with_text) for lp, t in zip(out.logprobs, out.output_ids, strict=True)
    ]
    prompt_ids = _item_ids(state, item)
    first = out.input_logprob_start
    meta["input_token_logprobs"] = [
        _entry(state, lp, t, with_text)
        for lp, t in zip(out.input_logprobs or [], prompt_ids[first:], strict=False)
    ]
    if item.top_logprobs_num > 0:
        meta["output_top_logprobs"] = _top_entries(state, list(out.top_logprobs or []), with_text)
        meta["input_top_logprobs"] = _top_entries(state, list(out.input_top_logprobs or []), with_text)
    return meta


def _item_ids(state: ServingState, item: NativeItem) -> list[int]:
    return item.input_ids if item.input_ids is not None else state.encode(item.text or "", item.field)


def _generation(state: ServingState, item: NativeItem) -> Generation:
    ids = _item_ids(state, item)
    params = item.sampling.to_params(state.engine.vocab_size)
    if params.sampling_seed is not None:
        params.sampling_seed += item.sample
    state.check_prompt(ids, params, item.field, "sampling_params.max_new_tokens")
    start: int | None = None
    if item.return_logprob:
        start = len(ids) - 1 if item.logprob_start_len < 0 else item.logprob_start_len
        if start >= len(ids):
            raise InvalidRequestError("logprob_start_len", f"is {start} but the prompt has {len(ids)} tokens")
    options = RequestOptions(
        rid=item.rid,
        top_logprobs_num=item.top_logprobs_num if item.return_logprob else 0,
        input_logprob_start=start,
    )
    return Generation(ids=ids, params=params, options=options)


def _answer(
    state: ServingState, item: NativeItem, out: GenerationOutput, rid: str, started: float, with_text: bool
) -> dict[str, Any]:
    return {
        "text": out.text,
        "output_ids": out.output_ids,
        "meta_info": _meta_info(state, item, out, rid, started, with_text),
    }


async def _generate(state: ServingState, request: Request, body: GenerateRequest) -> Any:
    started = time.monotonic()
    items = body.items()
    generations = [_generation(state, item) for item in items]
    rids = [item.rid or uuid.uuid4().hex for item in items]
    if body.stream:
        stream = _stream(state, request, body, items, generations, rids, started)
        return StreamingResponse(stream, media_type="text/event-stream")
    outputs = await state.generate_all(request, generations)
    answers = [
        _answer(state, item, out, rid, started, body.return_text_in_logprobs)
        for item, out, rid in zip(items, outputs, rids, strict=True)
    ]
    return answers if body.is_batch else answers[0]


async def _stream(
    state: ServingState,
    request: Request,
    body: GenerateRequest,
    items: list[NativeItem],
    generations: list[Generation],
    rids: list[str],
    started: float,
) -> AsyncIterator[str]:
    """SSE: each event carries the item's cumulative text and ids so far (SGLang's default)."""
    partial = [_empty_output(len(g.ids)) for g in generations]
    unsent = [0] * len(items)
    try:
        async for index, chunk in state.stream_all(request, generations):
            if chunk.error is not None:
                error = (
                    chunk.error
                    if isinstance(chunk.error, InferenceError)
                    else InferenceError(str(chunk.error))
                )
                yield f"data: {json.dumps(error_body(error))}\n\n"
                continue
            out = _accumulate(partial[index], chunk, state.engine.weight_version)
            unsent[index] += len(chunk.output_ids)
            interval = items[index].sampling.stream_interval or 1
            if chunk.output is None and unsent[index] < interval:
                continue
            unsent[index] = 0
            answer = _answer(state, items[index], out, rids[index], started, body.return_text_in_logprobs)
            if chunk.output is None:
                answer["meta_info"]["finish_reason"] = None
            if body.is_batch:
                answer["index"] = index
            yield f"data: {json.dumps(answer)}\n\n"
    except InferenceError as exc:
        yield f"data: {json.dumps(error_body(exc))}\n\n"
    yield "data: [DONE]\n\n"


def _empty_output(prompt_tokens: int) -> GenerationOutput:
    return GenerationOutput(
        output_ids=[], logprobs=[], text="", finish_reason={}, weight_version="", prompt_tokens=prompt_tokens
    )


def _accumulate(out: GenerationOutput, chunk: StreamChunk, version: str) -> GenerationOutput:
    if chunk.output is not None:
        return chunk.output
    out.output_ids += chunk.output_ids
    out.logprobs += chunk.logprobs
    if chunk.top_logprobs:
        out.top_logprobs = (out.top_logprobs or []) + chunk.top_logprobs
    out.text += chunk.text
    out.weight_version = version
    return out


def install(app: FastAPI, state: ServingState) -> None:
    @app.post("/generate")
    async def generate(request: Request, body: GenerateRequest) -> Any:
        with span("stacx.inference", "inference.generate", kind=SpanKind.SERVER,
                  context=propagate.extract(request.headers)):
            return await _generate(state, request, body)

    @app.get("/model_info")
    @app.get("/get_model_info")  # SGLang's older name, still served by SGLang
    async def model_info() -> dict[str, Any]:
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

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's older name, still served by SGLang
    async def server_info() -> dict[str, Any]:
        return _server_info(state)

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict[str, Any]:
        return {"weight_version": state.engine.weight_version}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        state.engine.flush_cache()
        return PlainTextResponse("Cache flushed.\n")

    @app.post("/abort_request")
    async def abort_request(body: AbortRequest) -> dict[str, Any]:
        message = body.abort_message or "aborted by /abort_request"
        found = state.engine.abort(body.rid or None, abort_all=body.abort_all, message=message)
        return {"success": True, "num_aborted": found}

    @app.get("/health_generate")
    async def health_generate() -> Response:
        if state.not_ready is not None:
            return JSONResponse({"status": "starting", "message": state.not_ready}, status_code=503)
        params = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
        try:
            future = state.engine.submit([state.engine.vocab_size - 1], params)
            await asyncio.wait_for(asyncio.wrap_future(future), timeout=20)
        except (InferenceError, TimeoutError) as exc:
            return JSONResponse({"status": "unhealthy", "message": str(exc)}, status_code=503)
        return Response(status_code=200)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request, body: UpdateWeightsRequest) -> JSONResponse:
        try:
            with span("stacx.inference", "inference.swap_weights", kind=SpanKind.SERVER,
                      context=propagate.extract(request.headers),
                      attributes={"stacx.weight_version": str(body.weight_version),
                                  "stacx.model_path": body.model_path}):
                aborted = await _swap_weights(state, body)
        except WeightLoadError as exc:
            return JSONResponse(
                {"success": False, "message": str(exc), **error_body(exc)}, status_code=exc.status_code
            )
        return JSONResponse(
            {
                "success": True,
                "num_paused_requests": aborted,
                "message": f"loaded {body.model_path} as weight version {state.engine.weight_version}",
            }
        )


def _server_info(state: ServingState) -> dict[str, Any]:
    engine = state.engine
    config = engine.config
    metrics = engine.metrics
    return {
        "version": "stacx-builtin",
        "model_path": state.model_path,
        "tokenizer_path": state.model_path,
        "served_model_name": state.served_model_name,
        "context_length": state.context_length,
        "device": str(engine.device),
        "weight_version": engine.weight_version,
        "max_running_requests": config.max_batch_size,
        "max_queued_requests": config.max_waiting_requests,
        "random_seed": config.seed,
        "disable_radix_cache": engine.prefix_cache is None,
        "prefix_cache_tokens": config.prefix_cache_tokens,
        "internal_states": [
            {
                "running_requests": metrics.gauges["running_requests"],
                "waiting_requests": metrics.gauges["waiting_requests"],
                "prefix_cache_hit_rate": metrics.gauges["prefix_cache_hit_rate"],
                "prefix_cache_tokens": metrics.gauges["prefix_cache_tokens"],
            }
        ],
    }


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
