"""Row operations on a Hugging Face `DynamicCache` for continuous batching.

Every row of a batch is left-padded to the same cache length T; `mask` [B, T] marks real tokens.
Rows join (`concat_rows`, padding the shorter side on the left), leave or repeat (`select_rows`),
and the all-padding columns on the left are dropped (`trim_left`). A prefill that reuses cached
prefixes starts from `from_prefixes` (each row's prefix right-aligned), so a row may hold padding
between its prefix and the rest of its prompt; the mask covers it. `row_kv` reads one row's real
tokens back out for the prefix cache; `truncate` undoes a forward that failed half way.
Legend: B = rows, H = key/value heads, T = cached positions, D = head dim.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "concat_rows",
    "from_prefixes",
    "is_row_editable",
    "row_kv",
    "select_rows",
    "stack_rows",
    "take_rows",
    "trim_left",
    "truncate",
]


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


def from_prefixes(prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None]) -> tuple[Any, torch.Tensor]:
    """A cache whose row i holds `prefixes[i]` (per layer [H, m_i, D]) right-aligned, and its mask.

    Returns (cache, mask [B, P]) with P = max m_i; rows without a prefix are all padding.
    """
    lengths = [0 if p is None else int(p[0][0].shape[1]) for p in prefixes]
    width = max(lengths)
    sample = next(p for p in prefixes if p is not None)
    mask = torch.zeros((len(prefixes), width), dtype=torch.long, device=sample[0][0].device)
    layers = []
    for layer in range(len(sample)):
        heads, _, dim = sample[layer][0].shape
        keys = sample[layer][0].new_zeros((len(prefixes), heads, width, dim))
        values = sample[layer][1].new_zeros((len(prefixes), heads, width, dim))
        for row, (prefix, length) in enumerate(zip(prefixes, lengths, strict=True)):
            if prefix is not None:
                keys[row, :, width - length :] = prefix[layer][0]
                values[row, :, width - length :] = prefix[layer][1]
        layers.append((keys, values))
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    return _rebuild(layers), mask


def row_kv(cache: Any, columns: torch.Tensor, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, keys and values [H, n, D] of `row` at cache `columns` [n] (copies)."""
    return [
        (layer.keys[row].index_select(1, columns), layer.values[row].index_select(1, columns))
        for layer in cache.layers
    ]


def truncate(cache: Any, length: int) -> None:
    """Drop cached positions past `length` in every layer (in place, row-editable caches)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.shape[2] > length:
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def take_rows(cache: Any, index: torch.Tensor) -> Any:
    """A new cache with copies of the rows at `index` (the source is left as it is)."""
    return _rebuild([(layer.keys[index], layer.values[index]) for layer in cache.layers])


def stack_rows(caches: list[Any]) -> Any:
    """One cache with the rows of `caches` in order (all of the same length)."""
    layers = zip(*(c.layers for c in caches), strict=True)
    return _rebuild([(torch.cat([x.keys for x in ls]), torch.cat([x.values for x in ls])) for ls in layers])
