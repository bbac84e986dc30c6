"""The vLLM engine's SGLang-API bridge on a fake vLLM (httpx MockTransport): request mapping, the
version gate, the reload path, seeds never sent. The real vLLM runs the same contract in
tests/integration/inference/test_engine_contract.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from stacx.infra.engine_venv import pypi_requirements, vllm_cpu_head_size_problem
from stacx.rollout.inference.sampling import SamplingParams
from stacx.rollout.inference.vllm import VLLMClient, completion_payload, parse_completion
from stacx.rollout.inference.vllm_bridge import BridgeState, VersionGate, build_bridge_app


class FakeVLLM:
    """Answers vLLM's routes; records every call (path, JSON body)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.version = "default"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.path, body))
        if request.url.path == "/v1/completions":
            n = body["max_tokens"]
            return httpx.Response(200, json={"choices": [{
                "text": "x" * n, "token_ids": list(range(7, 7 + n)), "prompt_token_ids": body["prompt"],
                "finish_reason": "length", "stop_reason": None,
                "logprobs": {"token_logprobs": [-0.5] * n}}],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}})
        if request.url.path == "/update_weight_version":
            self.version = body["new_version"]
        return httpx.Response(200, json={"status": "ok"})

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]


def _client(fake: FakeVLLM) -> TestClient:
    vllm = VLLMClient("http://vllm", "tiny", transport=httpx.MockTransport(fake))
    state = BridgeState(vllm=vllm, gate=VersionGate("0"), model_path="/m",
                        served_model_name="tiny", vocab_size=300)
    return TestClient(build_bridge_app(state))


def test_generate_sends_token_ids_and_answers_in_sglang_form_without_seeds() -> None:
    fake = FakeVLLM()
    with _client(fake) as client:
        body = {"input_ids": [1, 2, 3], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 2, "temperature": 1.0, "sampling_seed": 5, "n": 2}}
        answers = client.post("/generate", json=body).json()
    assert [a["output_ids"] for a in answers] == [[7, 8], [7, 8]]
    meta = answers[0]["meta_info"]
    assert meta["weight_version"] == "0" and meta["prompt_tokens"] == 3
    assert meta["output_token_logprobs"] == [[-0.5, 7, None], [-0.5, 8, None]]
    sent = [b for p, b in fake.calls if p == "/v1/completions"]
    assert len(sent) == 2 and all(b["prompt"] == [1, 2, 3] and b["return_token_ids"] for b in sent)
    assert all("seed" not in b and b["logprobs"] == 0 for b in sent)  # vLLM-CPU dies on seeded batches


def test_text_prompts_and_prompt_logprobs_are_refused_in_one_line() -> None:
    with _client(FakeVLLM()) as client:
        text = client.post("/generate", json={"text": "hi"})
        start = client.post("/generate", json={"input_ids": [1], "logprob_start_len": 0})
    assert text.status_code == 400 and "input_ids" in text.json()["error"]["message"]
    assert start.status_code == 400 and "prompt or top logprobs" in start.json()["error"]["message"]


def test_reload_goes_through_vllms_rl_path_and_sets_the_version() -> None:
    fake = FakeVLLM()
    with _client(fake) as client:
        answer = client.post("/update_weights_from_disk", json={"model_path": "/w/7", "weight_version": "7"})
        info = client.get("/get_model_info").json()
        one = {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
        generated = client.post("/generate", json=one)
    assert answer.json()["success"] and info["weight_version"] == "7" and info["model_path"] == "/w/7"
    assert generated.json()["meta_info"]["weight_version"] == "7"
    assert fake.paths()[:4] == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    assert fake.calls[1][1] == {"method": "reload_weights", "kwargs": {"weights_path": "/w/7"}}
    assert fake.version == "7"


def test_openai_routes_pass_through_without_seed() -> None:
    fake = FakeVLLM()
    with _client(fake) as client:
        client.post("/v1/completions", json={"model": "tiny", "prompt": [1], "max_tokens": 1, "seed": 3})
    assert fake.calls[-1][0] == "/v1/completions" and "seed" not in fake.calls[-1][1]


def test_a_swap_waits_for_generations_in_flight_and_holds_new_ones() -> None:
    async def run() -> list[str]:
        gate, order = VersionGate("0"), []

        async def generation(delay: float) -> None:
            async with gate.generation() as version:
                await asyncio.sleep(delay)
                order.append(f"gen@{version}")

        async def swap() -> None:
            async with gate.swap():
                await gate.drained()
                order.append("swap")
                gate.version = "1"

        first = asyncio.ensure_future(generation(0.05))
        await asyncio.sleep(0.01)
        swapping = asyncio.ensure_future(swap())
        await asyncio.sleep(0.01)
        late = asyncio.ensure_future(generation(0.0))
        await asyncio.gather(first, swapping, late)
        return order

    assert asyncio.run(run()) == ["gen@0", "swap", "gen@1"]


def test_payload_maps_sampling_and_parses_ids_and_logprobs() -> None:
    params = SamplingParams(max_new_tokens=4, temperature=0.0, top_k=0, stop=["</a>"], no_stop_trim=True)
    body = completion_payload("m", [5, 6], params, want_logprobs=False)
    assert body["temperature"] == 0.0 and body["top_k"] == -1 and "logprobs" not in body
    assert body["include_stop_str_in_output"] and body["stop"] == ["</a>"]
    result = parse_completion({"choices": [{"token_ids": [9], "text": "a", "finish_reason": "stop",
                                            "stop_reason": "</a>", "logprobs": {"token_logprobs": [-1.0]}}]},
                              "3", want_logprobs=True)
    assert result.output_ids == [9] and result.logprobs == [-1.0] and result.matched_stop == "</a>"
    with pytest.raises(Exception, match="stop_regex"):
        completion_payload("m", [1], SamplingParams(stop_regex=["x+"]), want_logprobs=True)


def test_the_wheels_local_torch_pin_becomes_pypis_release_and_extras_stay() -> None:
    env = {"platform_machine": "x86_64", "platform_system": "Linux", "python_version": "3.11",
           "sys_platform": "linux"}
    got = pypi_requirements([
        'torch==2.13.0+cpu; platform_machine == "x86_64"', 'torch==2.13.0; platform_system == "Darwin"',
        "fastapi[standard]<0.137.0,>=0.133.0", 'zentorch==2.13.0.1; extra == "zen"', "numpy",
    ], env)
    assert got == ["torch==2.13.0", "fastapi[standard]<0.137.0,>=0.133.0", "numpy"]


def test_a_head_size_vllm_cpu_lacks_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    problem = vllm_cpu_head_size_problem(str(tmp_path))
    assert problem is not None and "head_dim 16" in problem and "num_attention_heads: 2" in problem
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 2}))
    assert vllm_cpu_head_size_problem(str(tmp_path)) is None


def test_abort_all_goes_to_vllms_abort_route_and_single_aborts_are_refused() -> None:
    fake = FakeVLLM()
    with _client(fake) as client:
        assert client.post("/abort_request", json={"abort_all": True}).json()["success"]
        one = client.post("/abort_request", json={"rid": "r1"})
    assert fake.calls == [("/abort_requests", {})]
    assert one.status_code == 400 and "abort_all" in one.json()["error"]["message"]
