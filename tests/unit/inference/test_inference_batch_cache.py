"""Row operations on a real model's KV cache keep each row's next-token logits unchanged."""

from __future__ import annotations

from pathlib import Path

import torch

from stacx.rollout.inference import batch_cache, load_model


def _prefill(model, rows: list[list[int]]):  # type: ignore[no-untyped-def]
    from transformers import DynamicCache

    length = max(map(len, rows))
    ids = torch.tensor([[0] * (length - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in rows])
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(1) - 1).clamp(min=0),
        past_key_values=DynamicCache(config=model.config),
        use_cache=True,
    )
    return out.past_key_values, mask


def _next_logits(model, cache, mask, tokens: list[int], positions: list[int]):  # type: ignore[no-untyped-def]
    mask = torch.cat([mask, torch.ones(len(tokens), 1, dtype=mask.dtype)], dim=1)
    out = model(
        input_ids=torch.tensor(tokens)[:, None],
        attention_mask=mask,
        position_ids=torch.tensor(positions)[:, None],
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[:, -1]


def test_join_select_and_trim_preserve_row_results(tiny_model_dir: Path) -> None:
    model, _ = load_model(tiny_model_dir, device="cpu")
    rows = [[40, 41, 42, 43, 44, 45], [50, 51], [60, 61, 62]]
    with torch.no_grad():
        alone = [_next_logits(model, *_prefill(model, [r]), [70], [len(r)])[0] for r in rows]
        cache_a, mask_a = _prefill(model, rows[:1])
        cache_b, mask_b = _prefill(model, rows[1:])
        assert batch_cache.is_row_editable(cache_a)
        cache, mask = batch_cache.concat_rows(cache_a, mask_a, cache_b, mask_b)
        assert mask.tolist()[1] == [0, 0, 0, 0, 1, 1]
        keep = torch.tensor([1, 2])
        cache, mask = batch_cache.select_rows(cache, mask, keep)
        cache, mask = batch_cache.trim_left(cache, mask)
        assert mask.shape == (2, 3)  # the long row left: its padding columns are gone
        joined = _next_logits(model, cache, mask, [70, 70], [2, 3])
    assert torch.allclose(joined[0], alone[1], atol=1e-5)
    assert torch.allclose(joined[1], alone[2], atol=1e-5)
