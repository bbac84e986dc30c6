"""Planning one batched prefill: identical prompts share a row, cached prefixes are skipped.

Legend: U = unique prompts in the prefill, P = longest reused prefix, S = longest suffix (the
part actually computed), V = vocabulary. Row u's cache columns are
[padding | its cached prefix (m_u) | padding | its suffix (s_u)], P + S wide; the attention mask
marks the real ones and position ids count real tokens only, so padding never shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from stacx.rollout.inference import batch_cache
from stacx.rollout.inference.job import Job, TopLogprobs
from stacx.rollout.inference.prefix_cache import LayerKV, PrefixCache

__all__ = ["PrefillInputs", "PrefillRow", "build_inputs", "group_rows", "prompt_logprobs"]


@dataclass(slots=True)
class PrefillRow:
    """One unique prompt of a prefill and the jobs that asked for it."""

    ids: list[int]
    jobs: list[Job]
    logprob_start: int | None = None
    """Smallest `input_logprob_start` among the jobs (None: no prompt logprobs wanted)."""
    cached: int = 0
    """Leading tokens whose KV comes from the prefix cache."""
    prefix_kv: list[LayerKV] | None = field(default=None, repr=False)


@dataclass(slots=True)
class PrefillInputs:
    input_ids: torch.Tensor  # [U, S]
    mask: torch.Tensor  # [U, P + S]
    positions: torch.Tensor  # [U, S]
    cache: Any
    suffix_lengths: list[int]


def group_rows(jobs: list[Job], cache: PrefixCache | None) -> list[PrefillRow]:
    """Unique prompts in arrival order, each with its longest usable cached prefix."""
    rows: dict[tuple[int, ...], PrefillRow] = {}
    for job in jobs:
        row = rows.setdefault(tuple(job.input_ids), PrefillRow(ids=job.input_ids, jobs=[]))
        row.jobs.append(job)
        start = job.options.input_logprob_start
        if start is not None:
            row.logprob_start = start if row.logprob_start is None else min(row.logprob_start, start)
    for row in rows.values():
        if cache is None:
            continue
        limit = len(row.ids) - 1  # at least one token is computed: it gives the next-token logits
        if row.logprob_start is not None:
            limit = min(limit, max(row.logprob_start - 1, 0))  # logits are needed from there on
        if limit > 0:
            row.cached, row.prefix_kv = cache.match(row.ids, limit)
    return list(rows.values())


def build_inputs(
    rows: list[PrefillRow], pad_id: int, device: torch.device, empty_cache: Any
) -> PrefillInputs:
    """Model inputs for the suffixes of `rows`, on top of their cached prefixes."""
    suffixes = [row.ids[row.cached :] for row in rows]
    width = max(len(s) for s in suffixes)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    suffix_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, suffix in enumerate(suffixes):
        ids[r, width - len(suffix) :] = torch.tensor(suffix)
        suffix_mask[r, width - len(suffix) :] = 1
    ids, suffix_mask = ids.to(device), suffix_mask.to(device)
    cached = torch.tensor([row.cached for row in rows], device=device).unsqueeze(1)  # [U, 1]
    positions = (suffix_mask.cumsum(dim=1) - 1).clamp(min=0) + cached  # [U, S]
    if any(row.cached for row in rows):
        cache, prefix_mask = batch_cache.from_prefixes([row.prefix_kv for row in rows])
        mask = torch.cat([prefix_mask, suffix_mask], dim=1)
    else:
        cache, mask = empty_cache, suffix_mask
    return PrefillInputs(
        input_ids=ids, mask=mask, positions=positions, cache=cache, suffix_lengths=[len(s) for s in suffixes]
    )


def prompt_logprobs(
    logits: torch.Tensor, row: PrefillRow, start: int, temperature: float, top_k: int
) -> tuple[list[float | None], list[TopLogprobs | None] | None]:
    """Logprobs of `row.ids[start:]` from this row's prefill logits [S, V] (all positions kept).

    Position 0 has no logprob (nothing predicts it): None, as SGLang reports it.
    """
    length = len(row.ids)
    suffix = length - row.cached
    first = max(start, 1)  # first position with a predicting logit
    offset = logits.shape[0] - suffix  # logits column of prompt position `row.cached`
    columns = torch.arange(first - 1, length - 1, device=logits.device) - row.cached + offset
    full = torch.log_softmax(logits.index_select(0, columns).float() / temperature, dim=-1)  # [n, V]
    targets = torch.tensor(row.ids[first:], device=logits.device)
    values: list[float | None] = [None] * (first - start)
    values += full.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
    if top_k <= 0:
        return values, None
    top_values, top_ids = torch.topk(full, min(top_k, full.shape[-1]), dim=-1)
    tops: list[TopLogprobs | None] = [None] * (first - start)
    tops += [list(zip(v, i, strict=True)) for v, i in zip(top_values.tolist(), top_ids.tolist(), strict=True)]
    return values, tops
