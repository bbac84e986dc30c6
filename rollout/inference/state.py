"""What the routes share: the engine, the tokenizer, prompt checks, and waiting on generations.

Waiting is tied to the HTTP connection: a client that disconnects aborts its requests (the engine
drops them at the next step), for plain and streaming answers alike.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from stacx.rollout.inference.engine import BatchingEngine
from stacx.rollout.inference.errors import InferenceError, InvalidRequestError, ServerUnavailableError
from stacx.rollout.inference.job import GenerationOutput, RequestOptions, StreamChunk
from stacx.rollout.inference.prompt_limits import encode_within
from stacx.rollout.inference.sampling import SamplingParams

__all__ = ["ClientDisconnected", "Generation", "ServingState"]

Future = concurrent.futures.Future[GenerationOutput]


class ClientDisconnected(InferenceError):
    """The client went away; its requests were aborted."""

    status_code = 499


@dataclass(kw_only=True, slots=True)
class Generation:
    """One prompt to generate from, as the engine takes it."""

    ids: list[int]
    params: SamplingParams
    options: RequestOptions = field(default_factory=RequestOptions)


@dataclass(kw_only=True, slots=True)
class ServingState:
    """The engine, the tokenizer and what is loaded."""

    engine: BatchingEngine
    tokenizer: Any
    model_path: str
    served_model_name: str
    context_length: int
    swap_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    not_ready: str | None = None
    """Why the server is not ready yet (`/health` answers 503 with it); None once it is."""

    def check_prompt(self, ids: list[int], params: SamplingParams, field_name: str, limit_name: str) -> None:
        """Raise `InvalidRequestError` naming the field for empty, out-of-vocab or long input."""
        if not ids:
            raise InvalidRequestError(field_name, "is empty; send at least one token")
        vocab = self.engine.vocab_size
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
        bad_stop = [i for i in params.stop_token_ids if not 0 <= i < vocab]
        if bad_stop:
            raise InvalidRequestError(
                "stop_token_ids", f"{bad_stop[:5]} are outside the vocabulary [0, {vocab})"
            )

    def encode(self, text: str, field_name: str = "prompt") -> list[int]:
        """Token ids of `text`; a text surely past the context is refused before it is all
        tokenized (`InvalidRequestError` naming `field_name`)."""
        return encode_within(self.tokenizer, text, self.context_length, field_name)

    async def generate_all(self, request: Request, generations: list[Generation]) -> list[GenerationOutput]:
        """Run all generations; abort them all if the client disconnects or one fails."""
        futures = self._submit(generations)
        waiters = [asyncio.wrap_future(f) for f in futures]
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            pending: set[asyncio.Future[Any]] = {*waiters, watcher}
            while any(not w.done() for w in waiters):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if watcher in done:
                    raise ClientDisconnected("the client disconnected; its requests were aborted")
                for waiter in done:
                    if waiter.exception() is not None:
                        raise waiter.exception()  # type: ignore[misc]
            return [w.result() for w in waiters]
        finally:
            watcher.cancel()
            self._abort_unfinished(futures, "the request ended early")

    async def stream_all(
        self, request: Request, generations: list[Generation]
    ) -> AsyncIterator[tuple[int, StreamChunk]]:
        """(index, chunk) as the engine produces them, until every generation has ended."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, StreamChunk]] = asyncio.Queue()
        for index, generation in enumerate(generations):
            generation.options.on_chunk = _forward_to(loop, queue, index)
        futures = self._submit(generations)
        watcher = asyncio.ensure_future(_disconnected(request))
        remaining = len(futures)
        try:
            while remaining:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    return  # the client went away: the finally block aborts
                index, chunk = getter.result()
                if chunk.output is not None or chunk.error is not None:
                    remaining -= 1
                yield index, chunk
        finally:
            watcher.cancel()
            self._abort_unfinished(futures, "the client disconnected")

    def _submit(self, generations: list[Generation]) -> list[Future]:
        if self.not_ready is not None:  # base weights are not the policy anyone asked for
            raise ServerUnavailableError(f"not ready: {self.not_ready}; retry shortly")
        futures: list[Future] = []
        try:
            for g in generations:
                futures.append(self.engine.submit(g.ids, g.params, g.options))
        except Exception:
            self._abort_unfinished(futures, "another part of the request was refused")
            raise
        return futures

    def _abort_unfinished(self, futures: list[Future], message: str) -> None:
        for future in futures:
            if not future.done():
                self.engine.abort_job(future, message)


def _forward_to(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[int, StreamChunk]], index: int
) -> Any:
    def forward(chunk: StreamChunk) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (index, chunk))
        except RuntimeError:
            pass  # the event loop is closed: nobody is listening any more

    return forward


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
