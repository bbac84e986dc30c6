"""Pure sampling functions against hand-worked values."""

from __future__ import annotations

import math

import torch

from rollout.inference.sampling import sample_tokens, truncate_logits

INF = float("-inf")


def test_top_k_keeps_the_k_best() -> None:
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    out = truncate_logits(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert out.tolist() == [[INF, 4.0, 3.0, INF]]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # probabilities 0.5, 0.25, 0.125, 0.125 (in that order)
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    kept = truncate_logits(logits, torch.tensor([-1]), torch.tensor([0.7]))
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    best_only = truncate_logits(logits, torch.tensor([0]), torch.tensor([0.1]))
    assert torch.isfinite(best_only).tolist() == [[True, False, False, False]]


def test_greedy_rows_take_argmax_with_unscaled_logprobs() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0]])
    tokens, logprobs = sample_tokens(
        logits, torch.tensor([0.0, 0.0]), torch.tensor([-1, -1]), torch.tensor([1.0, 1.0])
    )
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logprobs, torch.tensor([math.log(0.75)] * 2))


def test_sampled_logprobs_use_the_temperature_scaled_distribution() -> None:
    logits = torch.tensor([[0.0, 2.0]])
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(
        logits, torch.tensor([2.0]), torch.tensor([-1]), torch.tensor([1.0]), generator
    )
    expected = torch.log_softmax(logits / 2.0, dim=-1)[0, tokens[0]]
    assert torch.allclose(logprobs[0], expected)
    _, raw = sample_tokens(
        logits,
        torch.tensor([2.0]),
        torch.tensor([-1]),
        torch.tensor([1.0]),
        torch.Generator().manual_seed(0),
        raw=True,
    )
    assert torch.allclose(raw[0], torch.log_softmax(logits, dim=-1)[0, tokens[0]])


def test_top_k_one_is_greedy_even_when_sampling() -> None:
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(1))
    tokens, _ = sample_tokens(
        logits, torch.full((16,), 1.5), torch.ones(16, dtype=torch.long), torch.ones(16)
    )
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()
