"""One request inside the engine: what it asked for, what it produced, how it finishes.

A `Job` is touched only by the engine thread once submitted, except `abort()` (a flag). It ends
exactly once, through `complete()` (a `GenerationOutput`) or `fail()` (an exception); both also
send the last `StreamChunk` to a streaming caller.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stacx.rollout.inference.detokenize import IncrementalDetokenizer, StopMatcher
from stacx.rollout.inference.grammar import TokenGuide
from stacx.rollout.inference.sampling import SamplingParams

__all__ = ["GenerationOutput", "Job", "RequestOptions", "StreamChunk", "TopLogprobs"]

TopLogprobs = list[tuple[float, int]]
"""(logprob, token id) pairs, most likely first."""


@dataclass(kw_only=True, slots=True)
class GenerationOutput:
    """What one request produced, and with which weights."""

    output_ids: list[int]
    logprobs: list[float]
    """Logprob of each output token (see `sampling` for the distribution)."""
    text: str
    finish_reason: dict[str, Any]
    """SGLang form: {"type": "stop", "matched": id | str}, {"type": "length", "length": n} or
    {"type": "abort", "message": ...}."""
    weight_version: str
    prompt_tokens: int
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (or from an identical prompt prefilled
    in the same batch)."""
    top_logprobs: list[TopLogprobs] | None = None
    """Per output token, when `top_logprobs_num` > 0."""
    input_logprobs: list[float | None] | None = None
    """Per prompt token from `input_logprob_start` (None for the very first prompt token)."""
    input_top_logprobs: list[TopLogprobs | None] | None = None
    input_logprob_start: int = 0


@dataclass(kw_only=True, slots=True)
class StreamChunk:
    """What one engine step added to a streaming request (deltas), or how it ended."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)
    text: str = ""
    """New text, held back while it could still be the start of a stop string."""
    output: GenerationOutput | None = None
    """Set on the last chunk of a finished request."""
    error: BaseException | None = None
    """Set on the last chunk of a failed request."""


@dataclass(kw_only=True, slots=True)
class RequestOptions:
    """What a request wants besides sampling."""

    rid: str | None = None
    """Request id for `abort`; unique among live requests."""
    top_logprobs_num: int = 0
    """Also return the K most likely tokens (and their logprobs) at each output position."""
    input_logprob_start: int | None = None
    """Return prompt-token logprobs from this position on (None: none)."""
    on_chunk: Callable[[StreamChunk], None] | None = None
    """Streaming: called from the engine thread after each step and once at the end."""


class Job:
    """A submitted request and its growing output."""

    def __init__(
        self, input_ids: list[int], params: SamplingParams, options: RequestOptions, stop_ids: frozenset[int]
    ) -> None:
        self.input_ids = input_ids
        self.params = params
        self.options = options
        self.stop_ids = stop_ids
        self.future: concurrent.futures.Future[GenerationOutput] = concurrent.futures.Future()
        self.arrived_s = time.monotonic()
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[TopLogprobs] | None = [] if options.top_logprobs_num > 0 else None
        self.input_logprobs: list[float | None] | None = None
        self.input_top_logprobs: list[TopLogprobs | None] | None = None
        self.cached_tokens = 0
        self.finish: dict[str, Any] | None = None
        self.abort_message: str | None = None
        self.guide: TokenGuide | None = None
        """Constrained-decoding state when the request set `regex` / `json_schema`."""
        self.generator: Any = None
        """The request's own torch.Generator when it set `sampling_seed` (engine thread)."""
        self._stops = StopMatcher(params.stop, params.stop_regex)
        needs_text = bool(self._stops) or options.on_chunk is not None
        self._detok: Any = None
        self._needs_text = needs_text
        self._stop_at: int | None = None
        self._sent_chars = 0
        self._pending = StreamChunk()

    @property
    def rid(self) -> str | None:
        return self.options.rid

    @property
    def done(self) -> bool:
        return self.future.done()

    def abort(self, message: str) -> None:
        """Ask the engine to end this request at the next step (any thread)."""
        self.abort_message = message

    def append(self, tokenizer: Any, token: int, logprob: float, top: TopLogprobs | None) -> None:
        """Record one sampled token and decide whether the request is finished."""
        self.output_ids.append(token)
        self.logprobs.append(logprob)
        if self.guide is not None:
            self.guide.advance(token)
        if self.top_logprobs is not None and top is not None:
            self.top_logprobs.append(top[: self.options.top_logprobs_num])
        if self._needs_text:
            if self._detok is None:
                self._detok = IncrementalDetokenizer(tokenizer, self.params.skip_special_tokens)
            self._detok.push(token)
        if self.options.on_chunk is not None:
            self._pending.output_ids.append(token)
            self._pending.logprobs.append(logprob)
            if self.top_logprobs is not None:
                self._pending.top_logprobs.append(self.top_logprobs[-1])
        self.finish = self._finish_reason(token)

    def _finish_reason(self, token: int) -> dict[str, Any] | None:
        if token in self.stop_ids and len(self.output_ids) >= self.params.min_new_tokens:
            return {"type": "stop", "matched": token}
        if self._stops and self._detok is not None:
            found = self._stops.find(self._detok.text)
            if found is not None:
                stop, index = found
                self._stop_at = index + len(stop) if self.params.no_stop_trim else index
                return {"type": "stop", "matched": stop}
        if self.abort_message is not None:
            return {"type": "abort", "message": self.abort_message}
        if len(self.output_ids) >= self.params.max_new_tokens:
            return {"type": "length", "length": self.params.max_new_tokens}
        return None

    def flush_chunk(self) -> None:
        """Send what this step added to a streaming caller (text held back near stop strings)."""
        if self.options.on_chunk is None or self.finish is not None:
            return
        text = self._detok.text if self._detok is not None else ""
        visible = len(text) - (self._stops_overlap() if self._stops else 0)
        chunk, self._pending = self._pending, StreamChunk()
        if visible > self._sent_chars:
            chunk.text, self._sent_chars = text[self._sent_chars : visible], visible
        if chunk.output_ids or chunk.text:
            self.options.on_chunk(chunk)

    def _stops_overlap(self) -> int:
        return max((len(s) for s in self.params.stop), default=1) - 1

    def final_text(self, tokenizer: Any) -> str:
        if self._stop_at is not None and self._detok is not None:
            return str(self._detok.text[: self._stop_at])
        ids = self.output_ids
        matched = (self.finish or {}).get("matched")
        if isinstance(matched, int) and ids and not self.params.no_stop_trim:
            ids = ids[:-1]  # the stop token is not part of the text (SGLang)
        return str(tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens))

    def complete(self, output: GenerationOutput) -> None:
        """Resolve with `output` (engine thread; a no-op when already resolved)."""
        if self.future.done():
            return
        if self.options.on_chunk is not None:
            chunk, self._pending = self._pending, StreamChunk()
            chunk.text = output.text[self._sent_chars :] if len(output.text) > self._sent_chars else ""
            chunk.output = output
            self.options.on_chunk(chunk)
        _resolve(self.future, output, None)

    def fail(self, error: BaseException) -> None:
        """Resolve with `error` (any thread; a no-op when already resolved)."""
        if self.future.done():
            return
        if self.options.on_chunk is not None:
            self.options.on_chunk(StreamChunk(error=error))
        _resolve(self.future, None, error)


def _resolve(
    future: concurrent.futures.Future[GenerationOutput],
    result: GenerationOutput | None,
    error: BaseException | None,
) -> None:
    try:
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass  # resolved meanwhile by another thread (stop() racing the engine)
