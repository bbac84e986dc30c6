"""SGLang's native API on the built-in server: batch, n, streaming, prompt logprobs, endpoints, and
the exact request bodies SGLang's frontend (`RuntimeEndpoint`: `gen`, `select`, `fork`) sends."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from inference_fixtures import serve_tiny

from stacx.rollout.inference import InferenceServer

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serve_tiny(tiny_model_dir, context_length=4096) as srv:
        yield srv


@pytest.fixture
def http(server: InferenceServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def _greedy(http: httpx.Client, text: str, max_new_tokens: int = 12, **params: Any) -> dict[str, Any]:
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True, **params}
    answer = http.post("/generate", json={"text": text, "sampling_params": sampling})
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def _teacher_forced(server: InferenceServer, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1, straight from the model."""
    with torch.no_grad():
        logits = server.engine.model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)


def _sse(response: httpx.Response) -> list[Any]:
    events = [line[len("data:") :].strip() for line in response.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_batch_inputs_and_n_come_back_in_sglang_order(http: httpx.Client) -> None:
    singles = [_greedy(http, t)["output_ids"] for t in ("ab", "cd")]
    body = {
        "text": ["ab", "cd"],
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True, "n": 2},
    }
    answers = http.post("/generate", json={**body, "rid": ["x", "y"]}).json()
    assert [a["output_ids"] for a in answers] == singles + singles  # prompts, then again for sample 2
    assert [a["meta_info"]["id"] for a in answers] == ["x_0", "y_0", "x_1", "y_1"]
    by_ids = http.post(
        "/generate",
        json={
            "input_ids": [[97, 98], [99, 100]],
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
        },
    ).json()
    assert [a["output_ids"] for a in by_ids] == singles


def test_n_samples_with_a_seed_are_distinct_and_reproducible(http: httpx.Client) -> None:
    body = {
        "text": PROMPT,
        "sampling_params": {
            "max_new_tokens": 16,
            "temperature": 1.0,
            "n": 3,
            "sampling_seed": 11,
            "ignore_eos": True,
        },
    }
    first = [a["output_ids"] for a in http.post("/generate", json=body).json()]
    again = [a["output_ids"] for a in http.post("/generate", json=body).json()]
    assert first == again
    assert len({tuple(o) for o in first}) == 3


def test_streaming_sends_cumulative_text_and_ends_with_done(http: httpx.Client) -> None:
    plain = _greedy(http, PROMPT, 20)
    response = http.post(
        "/generate",
        json={
            "text": PROMPT,
            "stream": True,
            "sampling_params": {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True},
        },
    )
    events = _sse(response)
    assert len(events) > 2
    assert all(events[i + 1]["text"].startswith(events[i]["text"]) for i in range(len(events) - 1))
    assert events[-1]["text"] == plain["text"] and events[-1]["output_ids"] == plain["output_ids"]
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])


def test_prefill_only_returns_prompt_logprobs(server: InferenceServer, http: httpx.Client) -> None:
    ids = server.state.encode(PROMPT)
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    meta = http.post("/generate", json=body).json()["meta_info"]
    entries = meta["input_token_logprobs"]
    assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
    assert [e[1] for e in entries] == ids and entries[0][0] is None
    assert torch.allclose(torch.tensor([e[0] for e in entries[1:]]), _teacher_forced(server, ids), atol=1e-4)
    tail = http.post("/generate", json={**body, "logprob_start_len": 5, "top_logprobs_num": 3}).json()[
        "meta_info"
    ]
    assert [e[0] for e in tail["input_token_logprobs"]] == pytest.approx(
        [e[0] for e in entries[5:]], abs=1e-4
    )
    assert all(len(top) == 3 and top[0][0] >= top[-1][0] for top in tail["input_top_logprobs"])


def test_top_logprobs_num_on_output_tokens(http: httpx.Client) -> None:
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 4,
        "return_text_in_logprobs": True,
    }
    meta = http.post("/generate", json=body).json()["meta_info"]
    for chosen, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True):
        assert len(top) == 4 and top[0][1] == chosen[1]  # greedy: the chosen token is the best one
        assert top[0][0] == pytest.approx(chosen[0]) and isinstance(top[0][2], str)


def test_min_new_tokens_stop_trim_and_penalties(http: httpx.Client) -> None:
    free = _greedy(http, PROMPT, 10)
    first = free["output_ids"][0]
    stopped = _greedy(http, PROMPT, 10, ignore_eos=False, stop_token_ids=[first])
    assert stopped["output_ids"] == [first] and stopped["meta_info"]["finish_reason"]["matched"] == first
    held = _greedy(http, PROMPT, 10, ignore_eos=False, stop_token_ids=[first], min_new_tokens=4)
    assert len(held["output_ids"]) >= 4 and first not in held["output_ids"][:3]
    stop = free["text"][4:6]
    trimmed = _greedy(http, PROMPT, 10, stop=[stop])
    kept = _greedy(http, PROMPT, 10, stop=[stop], no_stop_trim=True)
    assert not trimmed["text"].endswith(stop) and kept["text"] == trimmed["text"] + stop
    long = _greedy(http, PROMPT, 40)["output_ids"]
    penalized = _greedy(http, PROMPT, 40, repetition_penalty=2.0, frequency_penalty=2.0)["output_ids"]
    assert len(set(penalized)) > len(set(long))  # fewer repeats


def test_repeated_prompt_is_served_from_the_prefix_cache(server: InferenceServer, http: httpx.Client) -> None:
    text = "a long shared system prompt for the prefix cache test"
    first = _greedy(http, text)
    second = _greedy(http, text)
    assert second["output_ids"] == first["output_ids"]
    assert second["meta_info"]["cached_tokens"] == second["meta_info"]["prompt_tokens"] - 1
    assert server.engine.metrics.gauges["prefix_cache_hit_rate"] > 0


def test_service_endpoints(server: InferenceServer, http: httpx.Client) -> None:
    assert http.get("/get_weight_version").json() == {"weight_version": server.engine.weight_version}
    info = http.get("/get_server_info").json()
    assert info["model_path"] == server.state.model_path and "internal_states" in info
    assert http.get("/health_generate").status_code == 200
    assert http.post("/flush_cache").status_code == 200
    _greedy(http, "flushed prompt")
    again = _greedy(http, "flushed prompt")
    assert again["meta_info"]["cached_tokens"] > 0
    http.post("/flush_cache")
    assert _greedy(http, "flushed prompt")["meta_info"]["cached_tokens"] == 0


def test_abort_request_by_rid(server: InferenceServer, http: httpx.Client) -> None:
    result: dict[str, Any] = {}

    def long_request() -> None:
        body = {"text": "x", "rid": "long-1", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        result["answer"] = httpx.post(f"{server.base_url}/generate", json=body, timeout=60).json()

    thread = threading.Thread(target=long_request)
    thread.start()
    deadline = time.monotonic() + 30
    while server.engine.metrics.gauges["running_requests"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert http.post("/abort_request", json={"rid": "long-1"}).json()["num_aborted"] == 1
    thread.join(timeout=60)
    answer = result["answer"]
    assert answer["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(answer["output_ids"]) < 400


def test_client_disconnect_aborts_the_generation(server: InferenceServer) -> None:
    before = server.engine.metrics.counters["requests_aborted_total"]
    body = {"text": "y", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/generate", json=body, timeout=0.5)
    deadline = time.monotonic() + 30
    while server.engine.metrics.gauges["running_requests"] > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.engine.metrics.counters["requests_aborted_total"] == before + 1
    assert server.engine.metrics.gauges["running_requests"] == 0


# -- SGLang frontend (sglang.lang RuntimeEndpoint) request bodies, replayed verbatim -----------


def _frontend_gen_body(text: str, stop: list[str], stream: bool = False) -> dict[str, Any]:
    """`sgl.gen("answer", max_tokens=16, stop=stop, temperature=0)` as RuntimeEndpoint sends it."""
    body: dict[str, Any] = {
        "text": text,
        "sampling_params": {
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "max_new_tokens": 16,
            "min_new_tokens": 0,
            "n": 1,
            "stop": stop,
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
        },
    }
    if stream:
        body["stream"] = True
    return body


def test_frontend_gen_with_stop_plain_and_streamed(http: httpx.Client) -> None:
    free = _greedy(http, PROMPT, 16, ignore_eos=False)
    stop = free["text"][5:7] or "\n"
    answer = http.post("/generate", json=_frontend_gen_body(PROMPT, [stop])).json()
    assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert free["text"].startswith(answer["text"]) and stop not in answer["text"]
    streamed = _sse(http.post("/generate", json=_frontend_gen_body(PROMPT, [stop], stream=True)))
    pos, pieces = 0, []
    for data in streamed:  # RuntimeEndpoint.generate_stream's loop
        chunk_text = data["text"][pos:]
        pos += len(chunk_text)
        pieces.append(chunk_text)
    assert "".join(pieces) == answer["text"]


def test_frontend_select_and_fork(server: InferenceServer, http: httpx.Client) -> None:
    """`sgl.select("pick", choices)`: prefill-only requests, then prompt logprobs of each choice."""
    prompt, choices = "Q: 12+30=? A:", [" 42", " 24", " 12"]
    cached = http.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 0}}).json()
    prompt_len = cached["meta_info"]["prompt_tokens"]
    logprob_start_len = max(prompt_len - 2, 0)
    body = {
        "text": [prompt + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
        "logprob_start_len": logprob_start_len,
    }
    answers = http.post("/generate", json=body).json()
    assert len(answers) == 3
    normalized = []
    for choice, answer in zip(choices, answers, strict=True):
        entries = answer["meta_info"]["input_token_logprobs"]
        assert answer["meta_info"]["output_token_logprobs"] == []
        ids = server.state.encode(prompt + choice)
        expected = _teacher_forced(server, ids)[logprob_start_len - 1 :]
        assert torch.allclose(torch.tensor([e[0] for e in entries]), expected, atol=1e-4)
        assert isinstance(entries[0][2], str)  # token healing reads the text of the first entry
        values = [e[0] for e in entries if e[0]]
        normalized.append(sum(values) / len(values))
    unconditional = http.post(
        "/generate",
        json={
            "input_ids": [[e[1] for e in a["meta_info"]["input_token_logprobs"]] for a in answers],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
        },
    ).json()
    assert [len(a["meta_info"]["input_token_logprobs"]) for a in unconditional] == [1, 1, 1]
    assert max(range(3), key=lambda i: normalized[i]) in range(3)
    forks = [http.post("/generate", json=_frontend_gen_body(prompt + c, ["\n"])).json() for c in choices]
    assert all(f["meta_info"]["cached_tokens"] > 0 for f in forks)  # the shared prompt is reused
