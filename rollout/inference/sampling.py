"""Sampling: per-request parameters and pure functions from logits to tokens and logprobs.

Legend: B = rows in the decode batch, V = vocabulary size.
Logprobs are those of the chosen token under the temperature-scaled distribution *before* top-k /
top-p truncation (what a trainer recomputes as log_softmax(logits / T)); greedy rows (T = 0) use
T = 1. `raw=True` always uses T = 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["SamplingParams", "sample_tokens", "truncate_logits"]


@dataclass(kw_only=True, slots=True)
class SamplingParams:
    """How one request samples (the `sampling_params` of SGLang's `/generate`)."""

    max_new_tokens: int = 128
    """Upper bound on generated tokens."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 (or 0) keeps all."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: generation ends once the decoded text contains one (trimmed from `text`)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end generation, besides the model's EOS ids."""
    ignore_eos: bool = False
    """Keep going past EOS ids (benchmarks)."""
    skip_special_tokens: bool = True
    """Drop special tokens from the returned text."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def truncate_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p set to -inf.

    logits: [B, V]; top_k: [B] int (<= 0 keeps all); top_p: [B] float in (0, 1].
    """
    import torch

    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
    ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)  # [1, V]
    k = torch.where(top_k > 0, top_k, logits.shape[-1]).unsqueeze(1)  # [B, 1]
    drop_sorted = ranks >= k
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
    drop_sorted |= mass_before >= top_p.unsqueeze(1)
    drop_sorted[:, 0] = False  # always keep the best token
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
    raw: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (token ids [B], their logprobs [B]).

    logits: [B, V] float; temperature: [B] (<= 0 means greedy); top_k, top_p: [B].
    """
    import torch

    logits = logits.float()
    greedy = temperature <= 0.0  # [B]
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
    scaled = logits / scale  # [B, V]
    tokens = torch.argmax(logits, dim=-1)  # [B]
    if not bool(greedy.all()):
        needs_truncation = bool(((top_k > 0) | (top_p < 1.0)).any())
        candidates = truncate_logits(scaled, top_k, top_p) if needs_truncation else scaled
        probs = torch.softmax(candidates, dim=-1)
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        tokens = torch.where(greedy, tokens, sampled)
    source = logits if raw else scaled
    logprobs = torch.log_softmax(source, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, logprobs
