"""OpenAI-compatible `/v1/models`, `/v1/completions` and `/v1/chat/completions`.

Both generation routes take `n`, `stream` (SSE, `stream_options.include_usage`), logprobs with
alternatives, `seed` (choice i samples with seed + i) and the penalties. Tool calls are parsed
from `<tool_call>{...}</tool_call>` blocks; `tool_choice: "required"` or a named function primes
the assistant turn with the opening of a call, since there is no constrained decoding. A request
aborted by a weight update answers 503 (retriable), as OpenAI's finish reasons have no "abort".
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from stacx.rollout.inference.detokenize import token_bytes
from stacx.rollout.inference.errors import InferenceError, ServerUnavailableError
from stacx.rollout.inference.job import GenerationOutput, RequestOptions, TopLogprobs
from stacx.rollout.inference.native_routes import error_body
from stacx.rollout.inference.openai_api import ChatCompletionRequest, CompletionRequest
from stacx.rollout.inference.sampling import SamplingParams
from stacx.rollout.inference.state import Generation, ServingState

__all__ = [
    "ModelNotFoundError",
    "chat_message",
    "forced_call_text",
    "install",
    "parse_tool_calls",
    "streamed_content",
    "tool_primer",
]

DEFAULT_CHAT_MAX_TOKENS = 256
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ModelNotFoundError(InferenceError):
    """The request names a model this server does not serve."""

    status_code = 404

    def __init__(self, name: str, served: str) -> None:
        super().__init__(f"model: the model {name!r} does not exist here; this server serves {served!r}")
        self.field = "model"


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks out of `text`.

    A call's `arguments` is the model's own text of the value, byte for byte (not parsed and
    dumped again): an agent that sends the call back gets a prompt that extends the sampled
    tokens. A block that is not valid JSON with a string `name` stays in the content: model
    output is untrusted and must not fail the request.
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        block = match.group(1)
        try:
            payload = json.loads(block)
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            return match.group(0)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": payload["name"], "arguments": _arguments_text(block, payload)},
            }
        )
        return ""

    content = _TOOL_CALL.sub(take, text).strip()
    return content, calls


_JSON = json.JSONDecoder()


def _arguments_text(block: str, payload: dict[str, Any]) -> str:
    """The raw text of the `arguments` member of the JSON object `block` (a string value is
    the arguments text itself; no member means no arguments)."""
    arguments = payload.get("arguments")
    if arguments is None or isinstance(arguments, str):
        return "{}" if arguments is None else arguments
    start, end = _member_spans(block)["arguments"]
    return block[start:end]


def _member_spans(block: str) -> dict[str, tuple[int, int]]:
    """Where each member's value lies in the (valid) JSON object `block`; the last of duplicate
    keys wins, as in `json.loads`."""
    spans: dict[str, tuple[int, int]] = {}
    at = _skip_space(block, block.index("{") + 1)
    while block[at] != "}":
        key, at = _JSON.raw_decode(block, at)
        at = _skip_space(block, block.index(":", at) + 1)
        _, end = _JSON.raw_decode(block, at)
        spans[key] = (at, end)
        at = _skip_space(block, end)
        if block[at] == ",":
            at = _skip_space(block, at + 1)
    return spans


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def tool_primer(body: ChatCompletionRequest) -> str:
    """Text the assistant turn starts with: the opening of a call when one is required."""
    name = body.forced_tool()
    if name is not None:
        return f'{TOOL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '
    return f"{TOOL_OPEN}\n" if body.tool_choice == "required" else ""


def forced_call_text(primer: str, generated: str) -> str:
    """The primed opening plus the model's continuation, closed if the model did not close it."""
    text = primer + generated
    return text if not primer or TOOL_CLOSE in generated else text + TOOL_CLOSE


# -- shared pieces ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Choice:
    """One choice being produced: which prompt, its generation, and (streaming) what was sent."""

    index: int
    prompt: int
    generation: Generation
    prompt_ids: list[int] = field(default_factory=list)
    started: bool = False


def _check_model(state: ServingState, name: str | None) -> str:
    if name is None or name in (state.served_model_name, state.model_path):
        return name or state.served_model_name
    raise ModelNotFoundError(name, state.served_model_name)


def _finish(out: GenerationOutput, has_tool_calls: bool) -> str:
    kind = str(out.finish_reason.get("type", "stop"))
    if kind == "abort":
        raise ServerUnavailableError(
            f"the request was aborted: {out.finish_reason.get('message', '')}; retry it"
        )
    return "tool_calls" if has_tool_calls and kind == "stop" else kind


def _usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _choice_generations(
    ids: list[int], params: SamplingParams, n: int, options: RequestOptions
) -> list[Generation]:
    """n generations of one prompt; with a seed, sample i uses seed + i (distinct, reproducible)."""
    out = []
    for i in range(n):
        seed = None if params.sampling_seed is None else params.sampling_seed + i
        out.append(Generation(ids=ids, params=replace(params, sampling_seed=seed), options=replace(options)))
    return out


def _token_text(state: ServingState, token: int) -> str:
    return str(state.tokenizer.decode([token], skip_special_tokens=False))


def _chat_logprob(state: ServingState, token: int, logprob: float) -> dict[str, Any]:
    return {
        "token": _token_text(state, token),
        "logprob": logprob,
        "bytes": list(token_bytes(state.tokenizer, token)),
    }


def _chat_logprobs(
    state: ServingState, ids: list[int], logprobs: list[float], tops: list[TopLogprobs] | None
) -> dict[str, Any]:
    content = []
    for i, (token, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        entry = _chat_logprob(state, token, logprob)
        entry["top_logprobs"] = [_chat_logprob(state, t, lp) for lp, t in (tops[i] if tops else [])]
        content.append(entry)
    return {"content": content, "refusal": None}


def _completion_logprobs(
    state: ServingState,
    ids: list[int],
    logprobs: list[float | None],
    tops: list[TopLogprobs | None] | None,
    offset: int,
) -> dict[str, Any]:
    texts = [_token_text(state, t) for t in ids]
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    top_dicts = None
    if tops is not None:
        top_dicts = [None if top is None else {_token_text(state, t): lp for lp, t in top} for top in tops]
    return {"tokens": texts, "token_logprobs": logprobs, "top_logprobs": top_dicts, "text_offset": offsets}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _sse_errors(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Pass events through; an error mid-stream becomes an error event, then `[DONE]`."""
    try:
        async for event in events:
            yield event
    except InferenceError as exc:
        yield _sse(error_body(exc))
    yield "data: [DONE]\n\n"


# -- completions -----------------------------------------------------------------------------


def _completion_choices(state: ServingState, body: CompletionRequest) -> list[_Choice]:
    choices: list[_Choice] = []
    for p, prompt in enumerate(body.prompts()):
        ids = prompt if isinstance(prompt, list) else state.encode(prompt, "prompt")
        params = body.sampling(body.max_tokens, state.engine.vocab_size)
        state.check_prompt(ids, params, "prompt", "max_tokens")
        options = RequestOptions(
            top_logprobs_num=body.logprobs or 0,
            input_logprob_start=0 if body.echo and body.logprobs is not None else None,
        )
        for generation in _choice_generations(ids, params, body.n, options):
            choices.append(_Choice(index=len(choices), prompt=p, generation=generation, prompt_ids=ids))
    return choices


def _completion_choice(
    state: ServingState, body: CompletionRequest, choice: _Choice, out: GenerationOutput
) -> dict[str, Any]:
    prompt_text = state.tokenizer.decode(choice.prompt_ids, skip_special_tokens=False) if body.echo else ""
    logprobs = None
    if body.logprobs is not None:
        tops: list[TopLogprobs | None] | None = list(out.top_logprobs or []) if body.logprobs > 0 else None
        ids, values = list(out.output_ids), list[float | None](out.logprobs)
        if body.echo:
            ids = choice.prompt_ids + ids
            values = list(out.input_logprobs or []) + values
            if tops is not None:
                tops = list(out.input_top_logprobs or []) + tops
        logprobs = _completion_logprobs(state, ids, values, tops, 0)
    return {
        "index": choice.index,
        "text": prompt_text + out.text,
        "logprobs": logprobs,
        "finish_reason": _finish(out, False),
    }


async def _completions(state: ServingState, request: Request, body: CompletionRequest) -> Any:
    body.warn_unknown("/v1/completions")
    model = _check_model(state, body.model)
    choices = _completion_choices(state, body)
    created, rid = int(time.time()), f"cmpl-{uuid.uuid4().hex}"
    if body.stream:
        events = _stream_completions(state, request, body, choices, model, rid, created)
        return StreamingResponse(_sse_errors(events), media_type="text/event-stream")
    outputs = await state.generate_all(request, [c.generation for c in choices])
    prompt_tokens = sum(len(c.prompt_ids) for c in choices[:: body.n])  # n choices per prompt
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [_completion_choice(state, body, c, out) for c, out in zip(choices, outputs, strict=True)],
        "usage": _usage(
            prompt_tokens,
            sum(len(o.output_ids) for o in outputs),
            sum(o.cached_tokens for o in outputs[:: body.n]),
        ),
        "metadata": {"weight_version": outputs[0].weight_version},
    }


async def _stream_completions(
    state: ServingState,
    request: Request,
    body: CompletionRequest,
    choices: list[_Choice],
    model: str,
    rid: str,
    created: int,
) -> AsyncIterator[str]:
    base = {"id": rid, "object": "text_completion", "created": created, "model": model}
    completion_tokens, offsets = 0, [0] * len(choices)
    async for index, chunk in state.stream_all(request, [c.generation for c in choices]):
        if chunk.error is not None:
            raise chunk.error if isinstance(chunk.error, InferenceError) else InferenceError(str(chunk.error))
        choice = choices[index]
        text, ids, values = chunk.text, chunk.output_ids, chunk.logprobs
        finish = None
        if chunk.output is not None:
            finish = _finish(chunk.output, False)
            completion_tokens += len(chunk.output.output_ids)
        if body.echo and not choice.started:
            text = state.tokenizer.decode(choice.prompt_ids, skip_special_tokens=False) + text
        choice.started = True
        logprobs = None
        if body.logprobs is not None and ids:
            tops = list[TopLogprobs | None](chunk.top_logprobs) if body.logprobs > 0 else None
            logprobs = _completion_logprobs(state, ids, list[float | None](values), tops, offsets[index])
        offsets[index] += len(text)
        event = {
            **base,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        }
        if body.include_usage:
            event["usage"] = None
        yield _sse(event)
    if body.include_usage:
        prompt_tokens = sum(len(c.prompt_ids) for c in choices[:: body.n])
        yield _sse({**base, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})


# -- chat --------------------------------------------------------------------------------------


def _chat_prompt(state: ServingState, body: ChatCompletionRequest) -> tuple[list[int], str]:
    messages = [m.for_template(i) for i, m in enumerate(body.messages)]
    tools = body.tools if body.uses_tools else None
    text = state.tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    primer = tool_primer(body) if body.uses_tools else ""
    return state.encode(str(text) + primer, "messages"), primer


def chat_message(
    body: ChatCompletionRequest, text: str, primer: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The assistant message (content and parsed tool calls) for the generated `text`."""
    if body.uses_tools:
        content, calls = parse_tool_calls(forced_call_text(primer, text))
    else:
        content, calls = text, []
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls if body.parallel_tool_calls else calls[:1]
    return message, calls


async def _chat(state: ServingState, request: Request, body: ChatCompletionRequest) -> Any:
    body.warn_unknown("/v1/chat/completions")
    model = _check_model(state, body.model)
    ids, primer = _chat_prompt(state, body)
    limit = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_MAX_TOKENS
    params = body.sampling(limit, state.engine.vocab_size)
    state.check_prompt(
        ids, params, "messages", "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    )
    options = RequestOptions(top_logprobs_num=(body.top_logprobs or 0) if body.logprobs else 0)
    generations = _choice_generations(ids, params, body.n, options)
    created, rid = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"
    if body.stream:
        events = _stream_chat(state, request, body, generations, primer, model, rid, created)
        return StreamingResponse(_sse_errors(events), media_type="text/event-stream")
    outputs = await state.generate_all(request, generations)
    choices = []
    for i, out in enumerate(outputs):
        message, calls = chat_message(body, out.text, primer)
        choice: dict[str, Any] = {
            "index": i,
            "message": message,
            "finish_reason": _finish(out, bool(calls)),
            "logprobs": _chat_logprobs(state, out.output_ids, out.logprobs, out.top_logprobs)
            if body.logprobs
            else None,
        }
        if body.return_token_ids:
            choice["token_ids"] = out.output_ids
        choices.append(choice)
    response: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": _usage(len(ids), sum(len(o.output_ids) for o in outputs), outputs[0].cached_tokens),
        "metadata": {"weight_version": outputs[0].weight_version},
    }
    if body.return_token_ids:
        response["prompt_token_ids"] = ids
    return response


@dataclass(slots=True)
class _ChatStream:
    """What one streamed choice has shown so far."""

    text: str = ""
    sent: int = 0
    started: bool = False


def streamed_content(body: ChatCompletionRequest, text: str, primer: str) -> str:
    """The content a stream may show for `text`, the output so far: always a prefix of the
    content `chat_message` gives for the whole output, so streamed and plain answers agree.

    With tools, everything from `<tool_call>` on is held back (tool calls are sent whole in the
    last chunk), as is a partial opening tag at the end and whitespace at either end (the
    content is stripped); a primed call shows nothing until the end.
    """
    if not body.uses_tools:
        return text
    if primer:
        return ""
    at = text.find(TOOL_OPEN)
    if at < 0:
        at = len(text) - _partial_tag(text)
    return text[:at].strip()


def _partial_tag(text: str) -> int:
    """Length of the longest end of `text` that begins `<tool_call>`."""
    for keep in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_OPEN.startswith(text[-keep:]):
            return keep
    return 0


async def _stream_chat(
    state: ServingState,
    request: Request,
    body: ChatCompletionRequest,
    generations: list[Generation],
    primer: str,
    model: str,
    rid: str,
    created: int,
) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    streams = [_ChatStream() for _ in generations]
    completion_tokens = 0

    def event(index: int, delta: dict[str, Any], finish: str | None, logprobs: Any = None) -> str:
        payload: dict[str, Any] = {
            **base,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }
        if body.include_usage:
            payload["usage"] = None
        return _sse(payload)

    async for index, chunk in state.stream_all(request, generations):
        if chunk.error is not None:
            raise chunk.error if isinstance(chunk.error, InferenceError) else InferenceError(str(chunk.error))
        stream = streams[index]
        if not stream.started:
            stream.started = True
            yield event(index, {"role": "assistant", "content": ""}, None)
        logprobs = None
        if body.logprobs and chunk.output_ids:
            logprobs = _chat_logprobs(state, chunk.output_ids, chunk.logprobs, chunk.top_logprobs or None)
        if chunk.output is None:
            stream.text += chunk.text
            shown = streamed_content(body, stream.text, primer)
            new_text = shown[stream.sent :]
            stream.sent = max(stream.sent, len(shown))
            if new_text or logprobs:
                yield event(index, {"content": new_text} if new_text else {}, None, logprobs)
            continue
        completion_tokens += len(chunk.output.output_ids)
        message, calls = chat_message(body, chunk.output.text, primer)
        content = message["content"] or ""
        delta: dict[str, Any] = {}
        if len(content) > stream.sent:
            delta["content"] = content[stream.sent :]
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        yield event(index, delta, _finish(chunk.output, bool(calls)), logprobs)
    if body.include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(len(generations[0].ids), completion_tokens)})


# -- routes ------------------------------------------------------------------------------------


def _model_card(state: ServingState) -> dict[str, Any]:
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": 0,
        "owned_by": "stacx",
        "root": state.model_path,
        "max_model_len": state.context_length,
    }


def install(app: FastAPI, state: ServingState) -> None:
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        _check_model(state, model)
        return _model_card(state)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Any:
        return await _completions(state, request, body)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Any:
        return await _chat(state, request, body)
