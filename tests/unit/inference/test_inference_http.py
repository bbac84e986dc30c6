"""The HTTP server through `InferenceClient` and raw requests: SGLang shapes, errors, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from inference_fixtures import serve_tiny
from prometheus_client.parser import text_string_to_metric_families

from stacx.rollout.inference import (
    InferenceClient,
    InferenceServer,
    InvalidRequestError,
    SamplingParams,
)


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serve_tiny(tiny_model_dir, weight_version="0", context_length=256) as srv:
        yield srv


@pytest.fixture
def http(server: InferenceServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def _error(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


def test_generate_returns_sglang_shapes(http: httpx.Client) -> None:
    body = {
        "text": "1+1=",
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        "return_logprob": True,
    }
    answer = http.post("/generate", json=body).json()
    meta = answer["meta_info"]
    assert len(answer["output_ids"]) == meta["completion_tokens"]
    assert meta["prompt_tokens"] == 4 and meta["weight_version"] == "0"
    assert meta["finish_reason"]["type"] in {"length", "stop"}
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer["output_ids"]
    assert all(entry[0] <= 0 and entry[2] is None for entry in meta["output_token_logprobs"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_ids": []}, "input_ids"),
        ({"text": ""}, "input_ids"),
        ({"input_ids": [1] * 300}, "input_ids"),
        ({"text": "x" * 200, "sampling_params": {"max_new_tokens": 100}}, "text"),
        ({"input_ids": [100000]}, "input_ids"),
    ],
)
def test_bad_input_is_400_naming_the_field(http: httpx.Client, body: dict, field: str) -> None:
    response = http.post("/generate", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field
    assert _error(response).startswith(f"{field}:")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_ids": [1], "sampling_params": {"max_tokens": 3}}, "sampling_params.max_tokens"),
        ({"input_ids": "12"}, "input_ids"),
        ({"input_ids": [1], "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        (
            {"input_ids": [1], "sampling_params": {"repetition_penalty": 3}},
            "sampling_params.repetition_penalty",
        ),
        ({"input_ids": [1], "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}}, "min_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"logit_bias": {"99999": 1}}}, "sampling_params.logit_bias"),
        ({"input_ids": [[1], [2]], "rid": ["a"]}, "rid"),
    ],
)
def test_mistyped_or_out_of_range_field_is_400_naming_it(http: httpx.Client, body: dict, field: str) -> None:
    response = http.post("/generate", json=body)
    assert response.status_code == 400
    assert field in _error(response)


def test_unknown_top_level_field_is_ignored_with_a_warning(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"input_ids": [1, 2], "temprature": 0.5, "sampling_params": {"max_new_tokens": 2}}
    with caplog.at_level("WARNING", logger="stacx.rollout.inference.api"):
        response = http.post("/generate", json=body)
    assert response.status_code == 200 and len(response.json()["output_ids"]) == 2
    assert "temprature" in caplog.text


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"image_data": "cat.png"}, "image_data"),
        ({"lora_path": "adapter"}, "lora_path"),
        ({"sampling_params": {"ebnf": 'root ::= "a"'}}, "sampling_params.ebnf"),
        ({"sampling_params": {"structural_tag": "{}"}}, "sampling_params.structural_tag"),
    ],
)
def test_unsupported_fields_are_refused_by_name(http: httpx.Client, extra: dict, field: str) -> None:
    response = http.post("/generate", json={"text": "hi", **extra})
    assert response.status_code == 400
    assert _error(response).startswith(f"{field}: is not supported")


def test_sglang_nulls_and_empty_defaults_are_accepted(http: httpx.Client) -> None:
    """What SGLang's frontend sends for unset options: nulls, empty lists, its own defaults."""
    params = {
        "max_new_tokens": 3,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "stop_regex": [],
        "temperature": 0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": False,
        "regex": None,
        "json_schema": None,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
    }
    response = http.post("/generate", json={"text": "hi", "sampling_params": params, "return_logprob": None})
    assert response.status_code == 200, response.text


def test_openai_routes_answer_with_logprobs(http: httpx.Client) -> None:
    chat = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "temperature": 0,
            "logprobs": True,
            "return_token_ids": True,
        },
    ).json()
    choice = chat["choices"][0]
    assert chat["object"] == "chat.completion" and chat["metadata"]["weight_version"] == "0"
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert chat["usage"]["completion_tokens"] == len(choice["token_ids"])
    completion = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3, "logprobs": 0}).json()
    assert len(completion["choices"][0]["logprobs"]["token_logprobs"]) == 3
    assert completion["object"] == "text_completion" and completion["id"].startswith("cmpl-")
    assert chat["id"].startswith("chatcmpl-") and completion["metadata"]["weight_version"] == "0"
    bad = http.post("/v1/chat/completions", json={"messages": [], "max_tokens": 5})
    assert bad.status_code == 400 and "messages" in _error(bad)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exposition as Prometheus' own parser reads it: (name, labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_show_batched_decoding(server: InferenceServer, http: httpx.Client) -> None:
    async def burst() -> list[int]:
        async with InferenceClient(InferenceClient.Config(base_url=server.base_url)) as client:
            params = SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True)
            results = await asyncio.gather(*[client.generate([40 + i, 41], params) for i in range(8)])
        return [len(r.output_ids) for r in results]

    assert asyncio.run(burst()) == [16] * 8
    values = _samples(http.get("/metrics").text)
    steps = values[("stacx_inference_batch_size_count", ())]
    single = values[("stacx_inference_batch_size_bucket", (("le", "1.0"),))]
    assert steps > 0 and single < steps  # some steps decoded several requests together


def test_client_swap_changes_version_and_outputs(
    server: InferenceServer, other_model_dir: Path, tiny_model_dir: Path
) -> None:
    async def scenario() -> None:
        async with InferenceClient(InferenceClient.Config(base_url=server.base_url)) as client:
            params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
            before = await client.generate([50, 51, 52], params)
            answer = await client.update_weights_from_disk(str(other_model_dir), 5)
            assert answer["success"] is True
            after = await client.generate([50, 51, 52], params)
            info = await client.get_model_info()
            assert (before.weight_version, after.weight_version) == ("0", "5")
            assert after.policy_version == 5 and info.weight_version == "5"
            assert info.model_path == str(other_model_dir)
            assert after.output_ids != before.output_ids
            with pytest.raises(InvalidRequestError, match="not a directory"):
                await client.update_weights_from_disk("/nonexistent/model", 6)
            await client.update_weights_from_disk(str(tiny_model_dir), 0)  # restore
            again = await client.generate([50, 51, 52], params)
            assert again.output_ids == before.output_ids

    asyncio.run(scenario())


def test_health_and_model_info(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    info = http.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_type"] == "qwen2"


def test_a_server_waiting_for_weights_is_not_ready_until_they_are_current(tiny_model_dir: Path) -> None:
    """A server that follows a weight topic must not look ready on its base weights."""
    with serve_tiny(tiny_model_dir, wait_for_weights=True) as srv:
        for path in ("/health", "/health_generate"):
            waiting = httpx.get(f"{srv.base_url}{path}", timeout=30)
            assert waiting.status_code == 503 and waiting.json()["status"] == "starting", path
        early = httpx.post(f"{srv.base_url}/generate", json={"input_ids": [1, 2]}, timeout=30)
        assert early.status_code == 503 and early.headers["retry-after"] == "1", early.text
        srv.mark_weights_current()
        assert httpx.get(f"{srv.base_url}/health", timeout=30).json() == {"status": "ok"}
        assert httpx.get(f"{srv.base_url}/health_generate", timeout=60).status_code == 200
