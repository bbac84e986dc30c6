"""`AgentProxy`: the OpenAI-compatible front of the inference servers for deployed agents.

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (streaming and not, `n`, tools,
`tool_choice`, logprobs), the same under `/s/{session_id}/v1/...` (for clients that can only set
a `base_url`), `GET /v1/models`, `POST /v1/feedback` (a user's or application's delayed reward),
`GET /health`, `GET /metrics`.

Each call: session id from the `X-Stacx-Session` header or the URL path (else a fresh one,
returned in the `X-Stacx-Session` response header), pinned to one server (`SessionRouter`); the
prompt is rendered here and sent as `input_ids` to the server's native `/generate` with
`return_logprob`; the answer is shaped as OpenAI's; then one `AgentInteraction` per choice is
handed to the `EventRecorder` (never blocking the answer). The interaction id is the response's
`id` (`<id>/<i>` for choice i when n > 1), so feedback can name the call it rewards.

Weight swaps: the server finishes running requests on the old weights and runs queued ones on
the new; every interaction records the version that produced it. A server that is busy or
aborted a request (429/503) makes the proxy answer 429/503 with `Retry-After` (OpenAI clients
retry these), and nothing is recorded for that call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from opentelemetry import propagate, trace
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stacx.producers.tracing import trace_headers
from stacx.rollout.inference.app import FRAMEWORK_TELEMETRY
from stacx.rollout.inference.client import sampling_payload
from stacx.rollout.inference.errors import InferenceError
from stacx.rollout.inference.openai_api import ChatCompletionRequest, CompletionRequest
from stacx.rollout.proxy.continuation import ChatContinuations
from stacx.rollout.proxy.errors import ProxyConfigError, ProxyError, UnsupportedRequestError, UpstreamError
from stacx.rollout.proxy.metrics import ProxyMetrics
from stacx.rollout.proxy.recorder import EventRecorder, refused_letter
from stacx.rollout.proxy.render import (
    PromptRenderer,
    RenderedPrompt,
    chat_message,
    request_messages_json,
    streamed_content,
)
from stacx.rollout.proxy.routing import SessionRouter
from stacx.rollout.proxy.upstream import Generation, UpstreamClient
from stacx.schemas import topics
from stacx.schemas.http_limits import HttpLimits, RequestLimits
from stacx.schemas.records import AgentInteraction, Feedback, logprobs, loss_mask, now_ms, token_ids

__all__ = ["AgentProxy", "FeedbackRequest"]

log = logging.getLogger(__name__)
tracer = trace.get_tracer("stacx.proxy")

DEFAULT_CHAT_MAX_TOKENS = 256


MAX_ID_CHARS = 256
"""Longest session, episode or agent id (header, path or feedback field): it becomes a Kafka key."""


class FeedbackRequest(BaseModel):
    """Body of `POST /v1/feedback`: a reward for a session, or for one call of it. Every number
    must be finite (NaN, Infinity and 1e400 are refused naming the field)."""

    model_config = ConfigDict(allow_inf_nan=False)

    session_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    reward: float
    interaction_id: str | None = None
    source: str = "user"
    components: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)


@dataclass(slots=True)
class _Call:
    """What one proxied call knows about itself."""

    session_id: str
    episode_id: str
    agent_name: str
    endpoint: str
    response_id: str
    started: float
    headers: dict[str, bytes]
    upstream: str = ""


class AgentProxy:
    """Builds the FastAPI app of the proxy (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        upstreams: list[str]
        """Base URLs of the inference servers (SGLang API: built-in server or SGLang)."""
        served_model_name: str | None = None
        """Model name in responses and events; None: the first server's."""
        tokenizer_path: str | None = None
        """Tokenizer / chat template directory; None: the first server's `model_path`."""
        agent_name: str = "agent"
        """`agent_name` of events whose call sends no `X-Stacx-Agent` header."""
        agent_logs_topic: str = topics.AGENT_LOGS
        """Where interaction events go."""
        feedback_topic: str = topics.FEEDBACK
        """Where `POST /v1/feedback` events go."""
        session_header: str = "x-stacx-session"
        """Request header naming the session (else the URL path, else a fresh id)."""
        episode_header: str = "x-stacx-episode"
        """Request header naming the episode (defaults to the session id)."""
        agent_header: str = "x-stacx-agent"
        """Request header naming the agent."""
        max_pinned_sessions: int = 100_000
        """Sessions remembered by the router (least recently used are forgotten)."""
        exact_continuation: bool = False
        """Continue a session's chat with the sampled token ids instead of re-rendering the
        previous answer (see `stacx.rollout.proxy.continuation`); on for black-box scaffolds in RL."""
        upstream_timeout_s: float = 600.0
        """Timeout of one call to a server."""
        recorder: EventRecorder.Config = field(default_factory=EventRecorder.Config)
        """Bounded buffer in front of Kafka."""
        limits: HttpLimits = field(default_factory=HttpLimits)
        """Request body, header and read-time limits (413, 431, 408)."""

        def __post_init__(self) -> None:
            if not self.upstreams:
                raise ProxyConfigError(
                    "proxy.upstreams is empty: name at least one inference server URL "
                    "(e.g. http://127.0.0.1:30000)"
                )

    def __init__(
        self,
        config: Config,
        *,
        renderer: PromptRenderer,
        recorder: EventRecorder,
        served_model_name: str,
        transport: Any = None,
    ) -> None:
        self.config = config
        self.renderer = renderer
        self.recorder = recorder
        self.metrics: ProxyMetrics = recorder.metrics
        self.model_name = served_model_name
        self.router = SessionRouter(config.upstreams, config.max_pinned_sessions)
        self.upstream = UpstreamClient(config.upstream_timeout_s, transport=transport)
        self.continuations = (
            ChatContinuations(renderer.tokenizer, config.max_pinned_sessions)
            if config.exact_continuation
            else None
        )
        self.app = self._build_app()

    # -- app ---------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="stacx agent proxy", docs_url=None, redoc_url=None, **FRAMEWORK_TELEMETRY)
        app.add_middleware(RequestLimits, limits=self.config.limits, error_body=self._limit_error_body)
        self._install_errors(app)
        for prefix in ("", "/s/{session_id}"):
            app.post(f"{prefix}/v1/chat/completions")(self._chat_route)
            app.post(f"{prefix}/v1/completions")(self._completions_route)
            app.get(f"{prefix}/v1/models")(self._models)
        feedback_schema = {"content": {"application/json": {"schema": FeedbackRequest.model_json_schema()}}}
        app.post("/v1/feedback", status_code=202, openapi_extra={"requestBody": feedback_schema})(
            self._feedback
        )
        app.get("/health")(self._health)
        app.get("/metrics")(self._metrics)
        return app

    def _install_errors(self, app: FastAPI) -> None:
        @app.exception_handler(ProxyError)
        async def _proxy_error(_: Request, exc: ProxyError) -> Response:
            return self._error_response(exc)

        @app.exception_handler(RequestValidationError)
        async def _invalid(_: Request, exc: RequestValidationError) -> Response:
            self.metrics.inc("requests_invalid_total")
            return _validation_response(list(exc.errors()))

        @app.exception_handler(Exception)
        async def _unexpected(_: Request, exc: Exception) -> Response:
            """A bug: one JSON error for the client, counted, the traceback in the log."""
            log.error("proxy request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
            return self._error_response(ProxyError(f"internal error: {type(exc).__name__}: {exc}"))

    def _error_response(self, exc: ProxyError | InferenceError) -> Response:
        status = exc.status_code
        invalid = 400 <= status < 500 and status != 429
        self.metrics.inc("requests_invalid_total" if invalid else "requests_failed_total")
        headers: dict[str, str] = {}
        if isinstance(exc, UpstreamError) and exc.retriable:
            headers["Retry-After"] = f"{max(1, round(exc.retry_after_s or 1))}"
        body = {
            "error": {
                "message": str(exc),
                "type": type(exc).__name__,
                "param": getattr(exc, "field", None),
                "code": exc.status_code,
            }
        }
        return JSONResponse(body, status_code=exc.status_code, headers=headers)

    def _limit_error_body(self, status: int, message: str, param: str) -> dict[str, Any]:
        """A request refused by `RequestLimits`, counted, in the proxy's error shape."""
        self.metrics.inc("requests_invalid_total")
        error = {"message": f"{param}: {message}", "type": "invalid_request_error", "param": param}
        return {"error": {**error, "code": status}}

    async def _models(self) -> dict[str, Any]:
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "stacx"}
        return {"object": "list", "data": [card]}

    async def _health(self) -> dict[str, Any]:
        problem = self.recorder.problem()
        return {
            "status": "degraded" if problem else "ok",
            "buffered_events": self.recorder.num_buffered,
            "problem": problem,
        }

    async def _metrics(self) -> PlainTextResponse:
        self.metrics.set("pinned_sessions", self.router.num_pinned)
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def _feedback(self, request: Request) -> JSONResponse:
        body = await self._feedback_body(request)
        feedback = Feedback(
            session_id=body.session_id,
            reward=body.reward,
            interaction_id=body.interaction_id,
            source=body.source,
            components=dict(body.components),
            metadata=dict(body.metadata),
        )
        accepted = self.recorder.record(self.config.feedback_topic, feedback, trace_headers_dict())
        return JSONResponse({"accepted": accepted}, status_code=202)

    async def _feedback_body(self, request: Request) -> FeedbackRequest:
        """The feedback, or 400 naming the field; a refused one is also kept on the DLQ with the
        reason (the raw body, as sent), so a reward that never counted can still be found."""
        try:
            body: FeedbackRequest = await _parse(request, FeedbackRequest)
            return body
        except (RequestValidationError, ProxyError) as exc:
            reason = (
                _validation_message(list(exc.errors()))
                if isinstance(exc, RequestValidationError)
                else str(exc)
            )
            letter = refused_letter(
                self.config.feedback_topic, await request.body(), reason, type(exc).__name__
            )
            self.recorder.record(self.recorder.config.dlq_topic, letter, trace_headers_dict())
            raise

    # -- calls -------------------------------------------------------------------------------

    def _call(self, request: Request, endpoint: str, prefix: str) -> _Call:
        path_session = request.path_params.get("session_id")
        session = request.headers.get(self.config.session_header) or path_session or f"s-{uuid.uuid4().hex}"
        episode = request.headers.get(self.config.episode_header) or session
        agent = request.headers.get(self.config.agent_header) or self.config.agent_name
        cfg = self.config
        for name, value in (
            (cfg.session_header, session),
            (cfg.episode_header, episode),
            (cfg.agent_header, agent),
        ):
            if len(value) > MAX_ID_CHARS:
                raise UnsupportedRequestError(
                    name, f"is {len(value)} characters; send at most {MAX_ID_CHARS}"
                )
        return _Call(
            session_id=session,
            episode_id=episode,
            agent_name=agent,
            endpoint=endpoint,
            response_id=f"{prefix}-{uuid.uuid4().hex}",
            started=time.monotonic(),
            headers={},
        )

    def _response_headers(self, call: _Call) -> dict[str, str]:
        return {self.config.session_header: call.session_id, "x-stacx-interaction": call.response_id}

    async def _chat_route(self, request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        call = self._call(request, "chat", "chatcmpl")
        with tracer.start_as_current_span(
            "proxy.chat", context=propagate.extract(request.headers), kind=trace.SpanKind.SERVER
        ) as span:
            span.set_attribute("stacx.session_id", call.session_id)
            call.headers = trace_headers_dict()
            try:
                if body.stream:
                    return await self._chat_stream(call, body)
                return await self._chat(call, body)
            except InferenceError as exc:  # the request models raise these for bad values
                return self._error_response(_as_proxy_error(exc))

    async def _completions_route(self, request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        call = self._call(request, "completions", "cmpl")
        with tracer.start_as_current_span(
            "proxy.completions", context=propagate.extract(request.headers), kind=trace.SpanKind.SERVER
        ) as span:
            span.set_attribute("stacx.session_id", call.session_id)
            call.headers = trace_headers_dict()
            try:
                if body.echo:
                    raise UnsupportedRequestError("echo", "is not supported by the proxy")
                if body.stream:
                    return await self._completions_stream(call, body)
                return await self._completions(call, body)
            except InferenceError as exc:
                return self._error_response(_as_proxy_error(exc))

    # -- non-streaming -------------------------------------------------------------------------

    async def _chat(self, call: _Call, body: ChatCompletionRequest) -> Response:
        body.warn_unknown("/v1/chat/completions")
        prompt = self._render_chat(call, body)
        gens = await self._generate_n(call, prompt, self._chat_payload(body, prompt), body.n)
        choices, usage_out = [], 0
        for i, gen in enumerate(gens):
            message, calls = chat_message(body, gen.text, prompt.primer)
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "finish_reason": _finish(gen, bool(calls)),
                "logprobs": self._chat_logprobs(gen) if body.logprobs else None,
            }
            choices.append(choice)
            usage_out += len(gen.output_ids)
            self._record(
                call,
                body_messages=request_messages_json(body),
                prompt=prompt,
                gen=gen,
                index=i,
                n=body.n,
                extra=_chat_extra(body, calls),
            )
        answer = {
            "id": call.response_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": _usage(len(prompt.ids), usage_out, gens[0].cached_tokens),
            "metadata": {"weight_version": gens[0].weight_version, "session_id": call.session_id},
        }
        self._remember_chat(call, body, prompt, gens[0], choices[0]["message"]["content"] or "")
        self._done(call)
        return JSONResponse(answer, headers=self._response_headers(call))

    def _render_chat(self, call: _Call, body: ChatCompletionRequest) -> RenderedPrompt:
        if self.continuations is not None and not body.uses_tools:
            messages = [m.for_template(i) for i, m in enumerate(body.messages)]
            ids = self.continuations.prompt_ids(call.session_id, messages)
            if ids is not None:
                return RenderedPrompt(ids=ids)
        return self.renderer.chat(body)

    def _remember_chat(
        self,
        call: _Call,
        body: ChatCompletionRequest,
        prompt: RenderedPrompt,
        gen: Generation,
        content: str,
    ) -> None:
        """Remember a single answer's sampled ids, so the session's next call can continue them."""
        if self.continuations is None or body.uses_tools or body.n != 1:
            return
        messages = [m.for_template(i) for i, m in enumerate(body.messages)]
        self.continuations.remember(call.session_id, messages, prompt.ids, gen.output_ids, content)

    async def _completions(self, call: _Call, body: CompletionRequest) -> Response:
        body.warn_unknown("/v1/completions")
        prompt = self.renderer.completion(body)
        gens = await self._generate_n(call, prompt, self._completion_payload(body), body.n)
        choices = []
        for i, gen in enumerate(gens):
            choices.append(
                {
                    "index": i,
                    "text": gen.text,
                    "finish_reason": _finish(gen, False),
                    "logprobs": self._completion_logprobs(gen) if body.logprobs is not None else None,
                }
            )
            self._record(
                call,
                body_messages=json.dumps({"prompt": body.prompt}),
                prompt=prompt,
                gen=gen,
                index=i,
                n=body.n,
                extra=_temperature(body),
            )
        answer = {
            "id": call.response_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": _usage(len(prompt.ids), sum(len(g.output_ids) for g in gens), gens[0].cached_tokens),
            "metadata": {"weight_version": gens[0].weight_version, "session_id": call.session_id},
        }
        self._done(call)
        return JSONResponse(answer, headers=self._response_headers(call))

    def _done(self, call: _Call) -> None:
        self.metrics.inc("requests_total")
        self.metrics.observe_latency(time.monotonic() - call.started)

    async def _generate_n(
        self, call: _Call, prompt: RenderedPrompt, payload: dict[str, Any], n: int
    ) -> list[Generation]:
        """n samples: one `/generate` each (sample i with seed + i when a seed is set)."""
        seed = payload["sampling_params"].get("sampling_seed")
        payloads = []
        for i in range(n):
            params = dict(payload["sampling_params"])
            if seed is not None:
                params["sampling_seed"] = seed + i
            payloads.append({**payload, "input_ids": prompt.ids, "sampling_params": params})
        gens = await asyncio.gather(*(self._generate(call, p) for p in payloads))
        for gen in gens:
            _check_finished(gen)
        return list(gens)

    async def _generate(self, call: _Call, payload: dict[str, Any]) -> Generation:
        upstream = self.router.pick(call.session_id)
        try:
            with self.router.in_flight(upstream):
                call.upstream = upstream
                return await self.upstream.generate(upstream, payload)
        except UpstreamError as exc:
            other = self.router.repin(call.session_id, upstream) if exc.unreachable else None
            if other is None:
                raise
            log.warning("session %s moved from %s to %s: %s", call.session_id, upstream, other, exc)
            self.metrics.inc("sessions_repinned_total")
            with self.router.in_flight(other):
                call.upstream = other
                return await self.upstream.generate(other, payload)

    # -- streaming -----------------------------------------------------------------------------

    async def _open_stream(self, call: _Call, payload: dict[str, Any]) -> AsyncIterator[Generation]:
        upstream = self.router.pick(call.session_id)
        call.upstream = upstream
        try:
            return await self.upstream.stream(upstream, payload)
        except UpstreamError as exc:
            other = self.router.repin(call.session_id, upstream) if exc.unreachable else None
            if other is None:
                raise
            self.metrics.inc("sessions_repinned_total")
            call.upstream = other
            return await self.upstream.stream(other, payload)

    async def _chat_stream(self, call: _Call, body: ChatCompletionRequest) -> Response:
        if body.n != 1:
            raise UnsupportedRequestError("n", "must be 1 when streaming through the proxy")
        body.warn_unknown("/v1/chat/completions")
        prompt = self._render_chat(call, body)
        payload = {**self._chat_payload(body, prompt), "input_ids": prompt.ids}
        events = await self._open_stream(call, payload)
        return StreamingResponse(
            self._chat_chunks(call, body, prompt, events),
            media_type="text/event-stream",
            headers=self._response_headers(call),
        )

    async def _chat_chunks(
        self,
        call: _Call,
        body: ChatCompletionRequest,
        prompt: RenderedPrompt,
        events: AsyncIterator[Generation],
    ) -> AsyncIterator[str]:
        base = {
            "id": call.response_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_name,
        }

        def chunk(delta: dict[str, Any], finish: str | None, lp: Any = None) -> str:
            payload: dict[str, Any] = {
                **base,
                "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
            }
            if body.include_usage:
                payload["usage"] = None
            return _sse(payload)

        sent_text, sent_ids = 0, 0
        last: Generation | None = None
        try:
            yield chunk({"role": "assistant", "content": ""}, None)
            async for gen in events:
                last = gen
                lp = self._chat_logprobs(gen, sent_ids) if body.logprobs else None
                sent_ids = len(gen.output_ids)
                if gen.finish_reason is None:
                    new_text = streamed_content(body, gen.text, prompt.primer)[sent_text:]
                    if new_text or lp:
                        yield chunk({"content": new_text} if new_text else {}, None, lp)
                        sent_text += len(new_text)
                    continue
                _check_finished(gen)
                message, calls = chat_message(body, gen.text, prompt.primer)
                delta: dict[str, Any] = {}
                content = message["content"] or ""
                if len(content) > sent_text:
                    delta["content"] = content[sent_text:]
                if calls:
                    delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
                yield chunk(delta, _finish(gen, bool(calls)), lp)
                self._remember_chat(call, body, prompt, gen, content)
                self._record(
                    call,
                    body_messages=request_messages_json(body),
                    prompt=prompt,
                    gen=gen,
                    index=0,
                    n=1,
                    extra={**_chat_extra(body, calls), "stream": "true"},
                )
            if body.include_usage and last is not None:
                yield _sse(
                    {
                        **base,
                        "choices": [],
                        "usage": _usage(len(prompt.ids), len(last.output_ids), last.cached_tokens),
                    }
                )
        except ProxyError as exc:
            self.metrics.inc("requests_failed_total")
            yield _sse({"error": {"message": str(exc), "type": type(exc).__name__, "code": exc.status_code}})
        self._done(call)
        yield "data: [DONE]\n\n"

    async def _completions_stream(self, call: _Call, body: CompletionRequest) -> Response:
        if body.n != 1:
            raise UnsupportedRequestError("n", "must be 1 when streaming through the proxy")
        body.warn_unknown("/v1/completions")
        prompt = self.renderer.completion(body)
        payload = {**self._completion_payload(body), "input_ids": prompt.ids}
        events = await self._open_stream(call, payload)
        return StreamingResponse(
            self._completion_chunks(call, body, prompt, events),
            media_type="text/event-stream",
            headers=self._response_headers(call),
        )

    async def _completion_chunks(
        self, call: _Call, body: CompletionRequest, prompt: RenderedPrompt, events: AsyncIterator[Generation]
    ) -> AsyncIterator[str]:
        base = {
            "id": call.response_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
        }
        sent_text, sent_ids = 0, 0
        try:
            async for gen in events:
                finish = None
                if gen.finish_reason is not None:
                    _check_finished(gen)
                    finish = _finish(gen, False)
                lp = self._completion_logprobs(gen, sent_ids) if body.logprobs is not None else None
                sent_ids = len(gen.output_ids)
                yield _sse(
                    {
                        **base,
                        "choices": [
                            {
                                "index": 0,
                                "text": gen.text[sent_text:],
                                "logprobs": lp,
                                "finish_reason": finish,
                            }
                        ],
                    }
                )
                sent_text = len(gen.text)
                if finish is not None:
                    self._record(
                        call,
                        body_messages=json.dumps({"prompt": body.prompt}),
                        prompt=prompt,
                        gen=gen,
                        index=0,
                        n=1,
                        extra={**_temperature(body), "stream": "true"},
                    )
        except ProxyError as exc:
            self.metrics.inc("requests_failed_total")
            yield _sse({"error": {"message": str(exc), "type": type(exc).__name__, "code": exc.status_code}})
        self._done(call)
        yield "data: [DONE]\n\n"

    # -- payloads, logprobs, events ----------------------------------------------------------

    def _chat_payload(self, body: ChatCompletionRequest, prompt: RenderedPrompt) -> dict[str, Any]:
        limit = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_MAX_TOKENS
        params = body.sampling(limit, self.renderer.vocab_size)
        return {"sampling_params": sampling_payload(params), "return_logprob": True}

    def _completion_payload(self, body: CompletionRequest) -> dict[str, Any]:
        params = body.sampling(body.max_tokens, self.renderer.vocab_size)
        return {"sampling_params": sampling_payload(params), "return_logprob": True}

    def _chat_logprobs(self, gen: Generation, start: int = 0) -> dict[str, Any]:
        content = [
            {
                "token": self.renderer.token_text(t),
                "logprob": lp,
                "bytes": self.renderer.token_bytes(t),
                "top_logprobs": [],
            }
            for t, lp in zip(gen.output_ids[start:], gen.logprobs[start:], strict=False)
        ]
        return {"content": content, "refusal": None}

    def _completion_logprobs(self, gen: Generation, start: int = 0) -> dict[str, Any]:
        tokens = [self.renderer.token_text(t) for t in gen.output_ids[start:]]
        offsets, at = [], 0
        for text in tokens:
            offsets.append(at)
            at += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": gen.logprobs[start:],
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def _record(
        self,
        call: _Call,
        *,
        body_messages: str,
        prompt: RenderedPrompt,
        gen: Generation,
        index: int,
        n: int,
        extra: dict[str, str],
    ) -> None:
        interaction = build_interaction(
            call_session=call.session_id,
            interaction_id=call.response_id if n == 1 else f"{call.response_id}/{index}",
            agent_name=call.agent_name,
            model_name=self.model_name,
            messages=body_messages,
            prompt=prompt,
            gen=gen,
            metadata={
                "endpoint": call.endpoint,
                "episode_id": call.episode_id,
                "upstream": call.upstream,
                "latency_ms": str(int((time.monotonic() - call.started) * 1000)),
                **extra,
            },
        )
        self.recorder.record(self.config.agent_logs_topic, interaction, call.headers)

    async def aclose(self) -> None:
        await self.upstream.close()


def build_interaction(
    *,
    call_session: str,
    interaction_id: str,
    agent_name: str,
    model_name: str,
    messages: str,
    prompt: RenderedPrompt,
    gen: Generation,
    metadata: dict[str, str],
) -> AgentInteraction:
    """The event of one choice: prompt + completion ids, mask 1 and logprobs on the completion."""
    num_prompt, num_out = len(prompt.ids), len(gen.output_ids)
    version = gen.weight_version
    return AgentInteraction(
        session_id=call_session,
        interaction_id=interaction_id,
        agent_name=agent_name,
        model_name=model_name,
        policy_version=int(version) if version.lstrip("-").isdigit() else 0,
        messages=messages,
        response=gen.text,
        token_ids=token_ids([*prompt.ids, *gen.output_ids]),
        loss_mask=loss_mask([0] * num_prompt + [1] * num_out),
        logprobs=logprobs([0.0] * num_prompt + list(gen.logprobs[:num_out])),
        metadata={
            **metadata,
            "prompt_length": str(num_prompt),
            "weight_version": version,
            "finish_reason": gen.finish_type,
            "primer": prompt.primer,
        },
        created_at_ms=now_ms(),
    )


def trace_headers_dict() -> dict[str, bytes]:
    """The current trace context as Kafka headers (captured in the request's span)."""
    return dict(trace_headers())


async def _parse(request: Request, model: type[Any]) -> Any:
    try:
        data = await request.json()
    except (ValueError, RecursionError) as exc:  # syntax, not UTF-8, too deep, a 5000-digit int
        raise UnsupportedRequestError("body", f"is not valid JSON ({_json_problem(exc)})") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
    except InferenceError as exc:  # the request models refuse some values by name (lone surrogates)
        raise _as_proxy_error(exc) from exc


def _json_problem(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested deeper than the parser allows"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return str(exc).split(":", 1)[0] if "digits" in str(exc) else str(exc)


def _as_proxy_error(exc: InferenceError) -> ProxyError:
    error = UnsupportedRequestError(getattr(exc, "field", "body"), str(exc).split(": ", 1)[-1])
    error.status_code = exc.status_code
    return error


def _check_finished(gen: Generation) -> None:
    if gen.finish_type == "abort":
        raise UpstreamError(
            f"the server aborted the request ({gen.finish_reason}); retry it",
            status_code=503,
            retry_after_s=1.0,
        )


def _finish(gen: Generation, has_tool_calls: bool) -> str:
    kind = gen.finish_type
    return "tool_calls" if has_tool_calls and kind == "stop" else kind


def _temperature(body: ChatCompletionRequest | CompletionRequest) -> dict[str, str]:
    """The temperature the logprobs were taken at (0, greedy, means 1: see the server docs)."""
    return {"temperature": f"{body.temperature:g}"}


def _chat_extra(body: ChatCompletionRequest, calls: list[dict[str, Any]]) -> dict[str, str]:
    extra = _temperature(body)
    if body.tools:
        extra["tools"] = json.dumps(body.tools)
    if calls:
        extra["tool_calls"] = json.dumps([c["function"] for c in calls])
    return extra


def _usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _field_names(errors: list[Any]) -> list[str]:
    return [".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body" for e in errors]


def _validation_message(errors: list[Any]) -> str:
    return "; ".join(f"{name}: {e.get('msg')}" for name, e in zip(_field_names(errors), errors, strict=True))


def _validation_response(errors: list[Any]) -> JSONResponse:
    fields = _field_names(errors)
    return JSONResponse(
        {
            "error": {
                "message": _validation_message(errors),
                "type": "invalid_request_error",
                "param": fields[0] if fields else None,
                "code": 400,
            }
        },
        status_code=400,
    )
