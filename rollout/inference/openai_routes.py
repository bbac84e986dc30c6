"""OpenAI-compatible `POST /v1/completions` and `POST /v1/chat/completions` (non-streaming)."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from rollout.inference.api import ChatCompletionRequest, CompletionRequest
from rollout.inference.engine import GenerationOutput

if TYPE_CHECKING:
    from rollout.inference.app import ServingState

__all__ = ["install", "parse_tool_calls"]

DEFAULT_CHAT_MAX_TOKENS = 256
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks out of `text`.

    A block that is not valid JSON with a string `name` stays in the content: model output is
    untrusted and must not fail the request.
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        arguments = payload.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": payload["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        return ""

    content = _TOOL_CALL.sub(take, text).strip()
    return content, calls


def _finish(out: GenerationOutput, has_tool_calls: bool) -> str:
    kind = str(out.finish_reason.get("type", "stop"))
    return "tool_calls" if has_tool_calls and kind == "stop" else kind


def _usage(out: GenerationOutput) -> dict[str, int]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.output_ids),
        "total_tokens": out.prompt_tokens + len(out.output_ids),
    }


def _response(
    id_prefix: str, kind: str, model: str, choice: dict[str, Any], out: GenerationOutput
) -> dict[str, Any]:
    """The OpenAI response envelope around one choice (plus the served weight version)."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(out),
        "metadata": {"weight_version": out.weight_version},
    }


def _token_texts(state: ServingState, ids: list[int]) -> list[str]:
    return [state.tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def _chat_logprobs(state: ServingState, out: GenerationOutput) -> dict[str, Any]:
    return {
        "content": [
            {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
            for text, lp in zip(_token_texts(state, out.output_ids), out.logprobs, strict=True)
        ]
    }


def _completion_logprobs(state: ServingState, out: GenerationOutput) -> dict[str, Any]:
    texts = _token_texts(state, out.output_ids)
    offsets, position = [], 0
    for text in texts:
        offsets.append(position)
        position += len(text)
    return {"tokens": texts, "token_logprobs": out.logprobs, "top_logprobs": None, "text_offset": offsets}


def _chat_prompt(state: ServingState, body: ChatCompletionRequest) -> list[int]:
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    text = state.tokenizer.apply_chat_template(
        messages, tools=body.tools, add_generation_prompt=True, tokenize=False
    )
    return list(state.tokenizer.encode(text, add_special_tokens=False))


def install(app: FastAPI, state: ServingState) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> dict[str, Any]:
        ids = (
            body.prompt
            if isinstance(body.prompt, list)
            else list(state.tokenizer.encode(body.prompt, add_special_tokens=False))
        )
        params = body.to_params()
        state.check_prompt(ids, params, "prompt", "max_tokens")
        out = await state.generate(ids, params)
        choice = {
            "index": 0,
            "text": out.text,
            "finish_reason": _finish(out, False),
            "logprobs": _completion_logprobs(state, out) if body.logprobs is not None else None,
        }
        return _response("cmpl", "text_completion", body.model or state.served_model_name, choice, out)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> dict[str, Any]:
        ids = _chat_prompt(state, body)
        params = body.to_params(DEFAULT_CHAT_MAX_TOKENS)
        limit = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        state.check_prompt(ids, params, "messages", limit)
        out = await state.generate(ids, params)
        content, calls = parse_tool_calls(out.text) if body.tools else (out.text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": _finish(out, bool(calls)),
            "logprobs": _chat_logprobs(state, out) if body.logprobs else None,
        }
        model = body.model or state.served_model_name
        response = _response("chatcmpl", "chat.completion", model, choice, out)
        if body.return_token_ids:
            response["prompt_token_ids"] = ids
            choice["token_ids"] = out.output_ids
        return response
