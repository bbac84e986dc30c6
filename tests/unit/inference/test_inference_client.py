"""`InferenceClient` against scripted HTTP answers (httpx.MockTransport): parsing and retries."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from stacx.rollout.inference import (
    InferenceClient,
    InvalidRequestError,
    OverloadedError,
    SamplingParams,
    ServerError,
)

GENERATED = {
    "text": "ab",
    "output_ids": [97, 98],
    "meta_info": {
        "id": "r1",
        "finish_reason": {"type": "stop", "matched": 258},
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "weight_version": "4",
        "output_token_logprobs": [[-0.5, 97, None], [-1.25, 98, None]],
    },
}


def _client(handler: httpx.MockTransport | None = None, **overrides: float) -> InferenceClient:
    config = InferenceClient.Config(
        base_url="http://server", backoff_initial_s=0.001, max_retries=3, **overrides
    )  # type: ignore[arg-type]
    return InferenceClient(config, transport=handler)


def test_generate_sends_sglang_payload_and_parses_result() -> None:
    seen: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=GENERATED)

    async def call() -> None:
        async with _client(httpx.MockTransport(handle)) as client:
            result = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2, temperature=0))
        assert result.output_ids == [97, 98] and result.logprobs == [-0.5, -1.25]
        assert (result.weight_version, result.policy_version) == ("4", 4)
        assert (result.finish_reason, result.matched_stop) == ("stop", 258)

    asyncio.run(call())
    assert seen[0]["input_ids"] == [1, 2, 3] and seen[0]["return_logprob"] is True
    assert seen[0]["sampling_params"]["max_new_tokens"] == 2
    assert "stop" not in seen[0]["sampling_params"]  # empty lists are not sent


def test_retries_through_503_and_429_during_a_swap() -> None:
    answers = iter(
        [
            httpx.Response(503, json={"error": {"message": "swapping"}}),
            httpx.Response(429, headers={"Retry-After": "0"}, json={}),
            httpx.Response(200, json=GENERATED),
        ]
    )

    async def call() -> list[int]:
        async with _client(httpx.MockTransport(lambda _: next(answers))) as client:
            return (await client.generate([1])).output_ids

    assert asyncio.run(call()) == [97, 98]


def test_retries_connection_errors_then_gives_up_as_unavailable() -> None:
    calls = 0

    def refuse(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)

    async def call() -> None:
        async with _client(httpx.MockTransport(refuse)) as client:
            await client.get_model_info()

    from stacx.rollout.inference import ServerUnavailableError

    with pytest.raises(ServerUnavailableError, match="get_model_info"):
        asyncio.run(call())
    assert calls == 4  # first try + max_retries


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, InvalidRequestError), (422, InvalidRequestError), (500, ServerError), (429, OverloadedError)],
)
def test_non_retriable_or_exhausted_errors_carry_the_server_message(status: int, error: type) -> None:
    body = {"error": {"message": "input_ids: is empty"}}

    async def call() -> None:
        transport = httpx.MockTransport(lambda _: httpx.Response(status, json=body))
        async with _client(transport) as client:
            await client.generate([1])

    with pytest.raises(error, match="input_ids: is empty"):
        asyncio.run(call())


def test_repeats_a_request_whose_server_died_under_sglang_router_but_not_other_500s() -> None:
    lost = {"error": {"type": "Internal Server Error", "code": "call_upstream_request_error",
                      "message": "error sending request for url (http://127.0.0.1:1/generate)"}}
    answers = [httpx.Response(500, json=lost), httpx.Response(200, json=GENERATED),
               httpx.Response(500, json={"error": {"code": "internal", "message": "boom"}})]
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return answers[len(calls) - 1]

    async def run() -> None:
        async with _client(httpx.MockTransport(handler)) as client:
            assert (await client.generate([1])).output_ids == [97, 98]
            with pytest.raises(ServerError, match="boom"):
                await client.generate([1])

    asyncio.run(run())
    assert len(calls) == 3  # the lost one repeated once; the other 500 not repeated
