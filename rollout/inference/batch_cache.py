"""Row operations on a Hugging Face `DynamicCache` for continuous batching.

Every row of a batch is left-padded to the same cache length T; `mask` [B, T] marks real tokens.
Rows join (`concat_rows`, padding the shorter side on the left), leave (`select_rows`) and the
all-padding columns on the left are dropped (`trim_left`).
Legend: B = rows, H = key/value heads, T = cached positions, D = head dim.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["concat_rows", "is_row_editable", "select_rows", "trim_left"]


def is_row_editable(cache: Any) -> bool:
    """True when every layer is a plain full-attention `DynamicLayer` (tensors [B, H, T, D])."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _rebuild(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    from transformers.cache_utils import DynamicCache

    return DynamicCache(ddp_cache_data=layers)


def _pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    if width == 0:
        return x
    shape = list(x.shape)
    shape[dim] = width
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def concat_rows(
    cache_a: Any, mask_a: torch.Tensor, cache_b: Any, mask_b: torch.Tensor
) -> tuple[Any, torch.Tensor]:
    """Rows of `a` then rows of `b`, left-padded to a common length; returns (cache, mask)."""
    length = max(mask_a.shape[1], mask_b.shape[1])
    pad_a, pad_b = length - mask_a.shape[1], length - mask_b.shape[1]
    layers = []
    for layer_a, layer_b in zip(cache_a.layers, cache_b.layers, strict=True):
        keys = torch.cat([_pad_left(layer_a.keys, pad_a, 2), _pad_left(layer_b.keys, pad_b, 2)])
        values = torch.cat([_pad_left(layer_a.values, pad_a, 2), _pad_left(layer_b.values, pad_b, 2)])
        layers.append((keys, values))
    mask = torch.cat([_pad_left(mask_a, pad_a, 1), _pad_left(mask_b, pad_b, 1)])
    return _rebuild(layers), mask


def select_rows(cache: Any, mask: torch.Tensor, keep: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Only the rows at indices `keep` [B'], in that order (in place; any HF cache type)."""
    cache.batch_select_indices(keep)
    return cache, mask[keep]


def trim_left(cache: Any, mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Drop leading columns that are padding in every row (row-editable caches only)."""
    if not is_row_editable(cache):
        return cache, mask
    live = mask.any(dim=0)  # [T]
    first = int(torch.argmax(live.int())) if bool(live.any()) else mask.shape[1]
    if first == 0:
        return cache, mask
    layers = [(layer.keys[:, :, first:], layer.values[:, :, first:]) for layer in cache.layers]
    return _rebuild(layers), mask[:, first:]
