"""The radix prefix cache: longest-prefix match, edge splits, LRU eviction, and engine sharing."""

from __future__ import annotations

from pathlib import Path

import torch

from stacx.rollout.inference import BatchingEngine, SamplingParams, load_model
from stacx.rollout.inference.prefix_cache import PrefixCache


def _kv(tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake KV for 2 layers whose values encode the token ids, so slices can be checked."""
    keys = torch.tensor(tokens, dtype=torch.float32).view(1, -1, 1)  # [H=1, n, D=1]
    return [(keys, -keys), (keys * 10, -keys * 10)]


def test_match_returns_the_kv_of_the_longest_cached_prefix() -> None:
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3, 4], _kv([1, 2, 3, 4]), 0)
    cache.insert([1, 2, 9], _kv([9]), 2)  # splits the edge after [1, 2]
    length, kv = cache.match([1, 2, 9, 7], limit=4)
    assert length == 3 and kv is not None
    assert kv[0][0].flatten().tolist() == [1, 2, 9] and kv[1][1].flatten().tolist() == [-10, -20, -90]
    length, kv = cache.match([1, 2, 3, 4, 5], limit=3)  # the limit keeps the last tokens uncached
    assert length == 3 and kv is not None and kv[0][0].flatten().tolist() == [1, 2, 3]
    assert cache.match([5, 1], limit=2) == (0, None)
    assert cache.num_tokens == 5


def test_least_recently_used_leaves_are_evicted() -> None:
    cache = PrefixCache(max_tokens=6)
    cache.insert([1, 2, 3], _kv([1, 2, 3]), 0)
    cache.insert([4, 5, 6], _kv([4, 5, 6]), 0)
    cache.match([1, 2, 3], limit=3)  # touch the first
    cache.insert([7, 8], _kv([7, 8]), 0)
    assert cache.match([4, 5, 6], limit=3)[0] == 0
    assert cache.match([1, 2, 3], limit=3)[0] == 3 and cache.num_tokens == 5


def test_insert_without_the_prefix_at_hand_is_skipped() -> None:
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3], _kv([3]), 2)  # [1, 2] is not cached: nothing to attach to
    assert cache.num_tokens == 0


def test_grpo_group_and_second_turn_share_the_prompt(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir, device="cpu")
    shared = BatchingEngine(BatchingEngine.Config(batch_window_ms=20), model, tokenizer)
    plain = BatchingEngine(BatchingEngine.Config(prefix_cache_tokens=0), model, tokenizer)
    prompt = list(range(60, 100))
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    group = [shared.submit(prompt, params) for _ in range(4)]  # one GRPO group, arriving together
    shared.start()
    plain.start()
    try:
        outs = [f.result(timeout=60) for f in group]
        reference = plain.submit(prompt, params).result(timeout=60)
        assert all(o.output_ids == reference.output_ids for o in outs)
        assert sorted(o.cached_tokens for o in outs) == [0, 40, 40, 40]  # prefilled once
        turn = prompt + outs[0].output_ids + [10, 11]  # the next turn resends the history
        second = shared.submit(turn, params).result(timeout=60)
        assert second.cached_tokens == len(prompt) + len(outs[0].output_ids) - 1
        assert second.output_ids == plain.submit(turn, params).result(timeout=60).output_ids
        assert 0 < shared.metrics.gauges["prefix_cache_hit_rate"] < 1
        assert plain.metrics.counters["prefix_cache_hit_tokens_total"] == 0
    finally:
        shared.stop()
        plain.stop()
