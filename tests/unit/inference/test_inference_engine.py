"""The batching engine against transformers itself: greedy outputs, logprobs, batching, swaps."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from stacx.rollout.inference import BatchingEngine, SamplingParams, load_model
from stacx.rollout.inference.weight_files import check_state_dict, read_state_dict

PROMPTS = [
    "12+30=",
    "what is 7*6?",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "a",
    "The quick brown fox jumps over the lazy dog",
]


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[BatchingEngine]:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    engine = BatchingEngine(BatchingEngine.Config(batch_window_ms=5), model, tokenizer, "0")
    engine.start()
    yield engine
    engine.stop()


def _ids(engine: BatchingEngine, text: str) -> list[int]:
    return list(engine.tokenizer.encode(text, add_special_tokens=False))


def _reference_greedy(model: Any, ids: list[int], max_new_tokens: int) -> list[int]:
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )
    return out[0, len(ids) :].tolist()


def _teacher_forced_logprobs(
    model: Any, ids: list[int], output: list[int], temperature: float
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids + output])).logits[0, len(ids) - 1 : -1].float()
    scaled = logits / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, dim=-1).gather(1, torch.tensor(output)[:, None]).squeeze(1)


def test_greedy_equals_transformers_generate_under_concurrency(engine: BatchingEngine) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    prompts = [_ids(engine, p) for p in PROMPTS]
    futures = []
    for ids in prompts:  # staggered: later requests join a batch that is already decoding
        futures.append(engine.submit(ids, params))
        time.sleep(0.01)
    outputs = [f.result(timeout=60) for f in futures]
    for ids, out in zip(prompts, outputs, strict=True):
        reference = _reference_greedy(engine.model, ids, 24)
        assert out.output_ids == reference[: len(out.output_ids)]
        assert len(out.output_ids) == len(reference)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logprobs_match_teacher_forced_forward(engine: BatchingEngine, temperature: float) -> None:
    params = SamplingParams(max_new_tokens=16, temperature=temperature, ignore_eos=True)
    prompts = [_ids(engine, p) for p in PROMPTS]
    outputs = [f.result(timeout=60) for f in [engine.submit(ids, params) for ids in prompts]]
    for ids, out in zip(prompts, outputs, strict=True):
        assert len(out.output_ids) == 16 and len(out.logprobs) == 16
        expected = _teacher_forced_logprobs(engine.model, ids, out.output_ids, temperature)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4), (
            (torch.tensor(out.logprobs) - expected).abs().max()
        )


def test_concurrent_requests_share_decode_steps(engine: BatchingEngine) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    futures = [engine.submit(_ids(engine, f"{i}+{i}="), params) for i in range(8)]
    concurrent.futures.wait(futures, timeout=60)
    registry = engine.metrics.registry
    count = registry.get_sample_value("stacx_inference_batch_size_count") or 0.0
    total = registry.get_sample_value("stacx_inference_batch_size_sum") or 0.0
    single = registry.get_sample_value("stacx_inference_batch_size_bucket", {"le": "1.0"}) or 0.0
    assert count > 0
    assert total / count > 1.0  # mean rows per decode step
    assert single < count  # some steps had more than one row


def test_stop_token_ids_stop_strings_and_length(engine: BatchingEngine) -> None:
    ids = _ids(engine, PROMPTS[1])
    free = engine.submit(ids, SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)).result(
        timeout=60
    )
    assert free.finish_reason == {"type": "length", "length": 10}
    third = free.output_ids[2]
    by_id = engine.submit(
        ids, SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True, stop_token_ids=[third])
    ).result(timeout=60)
    first_hit = free.output_ids.index(third)
    assert by_id.output_ids == free.output_ids[: first_hit + 1]
    assert by_id.finish_reason == {"type": "stop", "matched": third}
    stop_text = engine.tokenizer.decode(free.output_ids[3:5])
    by_text = engine.submit(
        ids, SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True, stop=[stop_text])
    ).result(timeout=60)
    assert by_text.finish_reason == {"type": "stop", "matched": stop_text}
    assert stop_text not in by_text.text


def test_swap_changes_outputs_and_version(engine: BatchingEngine, other_model_dir: Path) -> None:
    ids = _ids(engine, PROMPTS[0])
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    before = engine.submit(ids, params).result(timeout=60)
    update = check_state_dict(engine.model, read_state_dict(other_model_dir))
    assert engine.update_weights(update, "7").result(timeout=60) == 0
    after = engine.submit(ids, params).result(timeout=60)
    assert (before.weight_version, after.weight_version) == ("0", "7")
    assert after.output_ids != before.output_ids
    other, _ = load_model(other_model_dir, device="cpu")
    assert after.output_ids == _reference_greedy(other, ids, 16)


def test_swap_waits_for_running_requests(engine: BatchingEngine, other_model_dir: Path) -> None:
    ids = _ids(engine, PROMPTS[2])
    running = engine.submit(ids, SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True))
    while engine.metrics.counters["generated_tokens_total"] < 2:
        time.sleep(0.005)
    swap = engine.update_weights(check_state_dict(engine.model, read_state_dict(other_model_dir)), "1")
    queued = engine.submit(ids, SamplingParams(max_new_tokens=4, temperature=0.0))
    first = running.result(timeout=120)
    assert swap.result(timeout=60) == 0
    assert first.weight_version == "0" and len(first.output_ids) == 200  # never mixed
    assert queued.result(timeout=60).weight_version == "1"


def test_swap_can_abort_running_requests(engine: BatchingEngine, other_model_dir: Path) -> None:
    running = engine.submit(
        _ids(engine, "x"), SamplingParams(max_new_tokens=2000, temperature=0.0, ignore_eos=True)
    )
    while engine.metrics.counters["generated_tokens_total"] < 2:
        time.sleep(0.005)
    update = check_state_dict(engine.model, read_state_dict(other_model_dir))
    assert engine.update_weights(update, "2", abort_running=True).result(timeout=60) == 1
    aborted = running.result(timeout=60)
    assert aborted.finish_reason["type"] == "abort"
    assert len(aborted.output_ids) < 2000
    assert engine.weight_version == "2"
