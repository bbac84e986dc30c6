"""One bad request never hurts another: a poisoned request among 8 good ones fails alone."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stacx.rollout.inference import BatchingEngine, InferenceServer, SamplingParams, load_model
from stacx.rollout.inference.errors import RequestFailedError

POISON = 7  # a byte no good prompt here contains
GOOD_PROMPTS = [[40 + i, 41, 42 + i] for i in range(8)]


def _poison_forward(model: Any, kind: str) -> None:
    """Make the model fail on rows that contain POISON: raise, or return NaN logits."""
    forward = model.forward

    @functools.wraps(forward)
    def poisoned(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs["input_ids"]
        rows = (ids == POISON).any(dim=1)
        if kind == "raise" and bool(rows.any()):
            raise RuntimeError("poisoned forward")
        out = forward(*args, **kwargs)
        if kind == "nan" and bool(rows.any()):
            out.logits[rows] = float("nan")
        return out

    model.forward = poisoned


@pytest.fixture
def make_engine(tiny_model_dir: Path) -> Iterator[Callable[[str], BatchingEngine]]:
    engines: list[BatchingEngine] = []

    def make(kind: str) -> BatchingEngine:
        model, tokenizer = load_model(tiny_model_dir, device="cpu")
        _poison_forward(model, kind)
        engine = BatchingEngine(BatchingEngine.Config(batch_window_ms=20), model, tokenizer, "0")
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def _solo_outputs(tiny_model_dir: Path, params: SamplingParams) -> list[list[int]]:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    engine = BatchingEngine(BatchingEngine.Config(prefix_cache_tokens=0), model, tokenizer, "0")
    engine.start()
    try:
        return [engine.submit(p, params).result(timeout=60).output_ids for p in GOOD_PROMPTS]
    finally:
        engine.stop()


# prefill: the prompt holds the poison; decode: the first sampled token is forced to be the
# poison (logit bias), so the *next* forward sees it; nan: the model's logits for it are NaN.
CASES = {
    "prefill": ("raise", [POISON, 41, 42], {}),
    "decode": ("raise", [50, 41, 42], {"logit_bias": {POISON: 1000.0}}),
    "sampling": ("nan", [POISON, 41, 42], {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_poisoned_request_fails_alone(make_engine: Any, tiny_model_dir: Path, case: str) -> None:
    kind, poisoned_prompt, extra = CASES[case]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    engine = make_engine(kind)
    good = [engine.submit(p, params) for p in GOOD_PROMPTS[:4]]
    bad = engine.submit(poisoned_prompt, dataclasses.replace(params, **extra))
    good += [engine.submit(p, params) for p in GOOD_PROMPTS[4:]]
    engine.start()  # all nine are waiting: they are admitted (and prefilled) together
    outputs = [f.result(timeout=60).output_ids for f in good]
    with pytest.raises(RequestFailedError) as failure:
        bad.result(timeout=60)
    assert outputs == _solo_outputs(tiny_model_dir, params)
    assert case in str(failure.value) or "not finite" in str(failure.value)
    assert engine.metrics.counters["requests_failed_total"] == 1
    later = engine.submit(GOOD_PROMPTS[0], params).result(timeout=60)  # the engine keeps serving
    assert later.output_ids == outputs[0]
    engine.stop(timeout_s=10)
    assert not engine.is_alive()


def test_a_failed_step_never_leaves_admitted_requests_waiting(make_engine: Any) -> None:
    """Even a failure outside the per-request guards fails the requests in flight, never hangs."""
    engine = make_engine("none")

    def broken_join(*_: Any) -> Any:
        raise RuntimeError("bug in the batch join")

    engine.submit(GOOD_PROMPTS[0], SamplingParams(max_new_tokens=50, temperature=0.0, ignore_eos=True))
    engine.start()
    while engine.metrics.counters["generated_tokens_total"] < 2:
        time.sleep(0.005)
    import stacx.rollout.inference.engine as engine_module

    original = engine_module._join
    engine_module._join = broken_join  # the next admission fails after its prefill
    try:
        late = engine.submit(GOOD_PROMPTS[1], SamplingParams(max_new_tokens=4, temperature=0.0))
        with pytest.raises(RequestFailedError, match="bug in the batch join"):
            late.result(timeout=60)
    finally:
        engine_module._join = original
    after = engine.submit(GOOD_PROMPTS[2], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert len(after.result(timeout=60).output_ids) == 4


def test_stop_fails_waiting_and_running_requests(make_engine: Any) -> None:
    engine = make_engine("none")
    engine.start()
    running = engine.submit(
        GOOD_PROMPTS[0], SamplingParams(max_new_tokens=3000, temperature=0.0, ignore_eos=True)
    )
    while engine.metrics.counters["generated_tokens_total"] < 2:
        time.sleep(0.005)
    engine.stop(timeout_s=10)
    with pytest.raises(Exception, match="stopped"):
        running.result(timeout=10)
    assert not engine.is_alive()


# -- through HTTP -------------------------------------------------------------------------------


@pytest.fixture
def poisoned_server(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    srv = InferenceServer(
        InferenceServer.Config(
            model_path=str(tiny_model_dir),
            port=0,
            context_length=256,
            engine=BatchingEngine.Config(batch_window_ms=20),
        )
    )
    _poison_forward(srv.engine.model, "raise")
    srv.start()
    yield srv
    srv.stop()


def test_http_poisoned_request_in_a_batch_of_eight(poisoned_server: InferenceServer) -> None:
    def body(ids: list[int], temperature: float = 0.0) -> dict[str, Any]:
        return {"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "temperature": temperature}}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=poisoned_server.base_url, timeout=60) as client:
            requests = [client.post("/generate", json=body(p)) for p in GOOD_PROMPTS]
            requests.insert(3, client.post("/generate", json=body([POISON, 41, 42])))
            requests.append(client.post("/generate", json=body([60, 61], temperature=1e-45)))
            return await asyncio.gather(*requests)

    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 9 and statuses[3] == 500, statuses
    error = responses[3].json()["error"]
    assert error["type"] == "RequestFailedError" and "poisoned forward" in error["message"]
    tiny = responses[-1].json()  # temperature 1e-45 is served greedily, as by SGLang
    greedy = httpx.post(f"{poisoned_server.base_url}/generate", json=body([60, 61]), timeout=60).json()
    assert tiny["output_ids"] == greedy["output_ids"]
    metrics = text_string_to_metric_families(httpx.get(f"{poisoned_server.base_url}/metrics").text)
    failed = {s.name: s.value for family in metrics for s in family.samples}[
        "stacx_inference_requests_failed_total"
    ]
    assert failed == 1
    poisoned_server.stop()  # clean shutdown
    assert not poisoned_server.engine.is_alive()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_temperature_is_400_with_a_json_body(poisoned_server: InferenceServer, value: str) -> None:
    raw = json.dumps({"input_ids": [1, 2], "sampling_params": {"temperature": float(value)}})
    response = httpx.post(f"{poisoned_server.base_url}/generate", content=raw, timeout=30)
    assert response.status_code == 400
    assert "sampling_params.temperature" in response.json()["error"]["message"]


def test_nan_logits_row_reports_non_finite(make_engine: Any) -> None:
    engine = make_engine("nan")
    engine.start()
    bad = engine.submit([POISON, 1], SamplingParams(max_new_tokens=3, temperature=0.7))
    with pytest.raises(RequestFailedError, match="not finite"):
        bad.result(timeout=60)
    assert engine.metrics.counters["requests_failed_total"] == 1
