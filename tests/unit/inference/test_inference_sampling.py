"""Pure sampling functions against hand-worked values."""

from __future__ import annotations

import math

import torch

from stacx.rollout.inference.sampling import (
    RowSampling,
    SamplingParams,
    apply_penalties,
    sample_tokens,
    truncate_logits,
)

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


def _rows(
    params: list[SamplingParams], vocab: int = 2, outputs: list[list[int]] | None = None
) -> RowSampling:
    outputs = outputs or [[] for _ in params]
    stop_ids = [frozenset({vocab - 1}) for _ in params]
    return RowSampling.build(params, outputs, stop_ids, [None] * len(params), vocab, torch.device("cpu"))


def test_greedy_rows_take_argmax_with_unscaled_logprobs() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(3.0), 0.0]])
    greedy = SamplingParams(temperature=0.0)
    result = sample_tokens(logits, _rows([greedy, greedy]))
    assert result.tokens.tolist() == [1, 0]
    assert torch.allclose(result.logprobs, torch.tensor([math.log(0.75)] * 2))


def test_temperature_below_the_floor_is_greedy() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.5]])
    result = sample_tokens(logits, _rows([SamplingParams(temperature=1e-45)], vocab=3))
    assert result.tokens.tolist() == [1] and bool(result.ok.all())


def test_sampled_logprobs_use_the_temperature_scaled_distribution() -> None:
    logits = torch.tensor([[0.0, 2.0]])
    hot = _rows([SamplingParams(temperature=2.0)])
    result = sample_tokens(logits, hot, torch.Generator().manual_seed(0))
    expected = torch.log_softmax(logits / 2.0, dim=-1)[0, result.tokens[0]]
    assert torch.allclose(result.logprobs[0], expected)
    raw = sample_tokens(
        logits, _rows([SamplingParams(temperature=2.0)]), torch.Generator().manual_seed(0), raw=True
    )
    assert torch.allclose(raw.logprobs[0], torch.log_softmax(logits, dim=-1)[0, result.tokens[0]])


def test_top_k_one_is_greedy_even_when_sampling() -> None:
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=1.5, top_k=1)] * 16
    result = sample_tokens(logits, _rows(params, vocab=50))
    assert result.tokens.tolist() == logits.argmax(dim=-1).tolist()


def test_non_finite_rows_are_flagged_not_raised() -> None:
    logits = torch.tensor([[0.0, 1.0], [float("nan"), 1.0], [float("inf"), 0.0]])
    result = sample_tokens(
        logits, _rows([SamplingParams(temperature=0.8)] * 3), torch.Generator().manual_seed(0)
    )
    assert result.ok.tolist() == [True, False, False]


def test_penalties_by_hand() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    counts = torch.tensor([[2.0, 1.0, 0.0]])
    out = apply_penalties(
        logits, counts, torch.tensor([[0.5]]), torch.tensor([[0.25]]), torch.tensor([[2.0]])
    )
    # token 0: 2/2 - 0.5*2 - 0.25 = -0.25; token 1: -2*2 - 0.5 - 0.25 = -4.75; token 2 unseen: 1
    assert torch.allclose(out, torch.tensor([[-0.25, -4.75, 1.0]]))


def test_min_p_drops_tokens_below_a_share_of_the_best() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = truncate_logits(logits, torch.tensor([-1]), torch.tensor([1.0]), torch.tensor([0.2]))
    assert torch.isfinite(kept).tolist() == [[True, True, True, False]]  # 0.05 < 0.2 * 0.5


def test_min_new_tokens_bans_stop_ids_until_reached() -> None:
    logits = torch.tensor([[0.0, 5.0]])  # token 1 (the stop id) is the best
    params = SamplingParams(temperature=0.0, min_new_tokens=2)
    rows = _rows([params])
    assert sample_tokens(logits, rows).tokens.tolist() == [0]
    rows.advance(torch.tensor([0]))
    rows.advance(torch.tensor([0]))
    assert sample_tokens(logits, rows).tokens.tolist() == [1]


def test_seeded_rows_reproduce_whatever_the_batch() -> None:
    logits = torch.zeros(1, 1000)
    seeded = SamplingParams(temperature=1.0, sampling_seed=7)

    def draw(batch: int) -> int:
        params = [SamplingParams(temperature=1.0)] * (batch - 1) + [seeded]
        generators = [None] * (batch - 1) + [torch.Generator().manual_seed(7)]
        rows = RowSampling.build(
            params, [[]] * batch, [frozenset()] * batch, generators, 1000, torch.device("cpu")
        )
        return int(
            sample_tokens(logits.expand(batch, -1), rows, torch.Generator().manual_seed(batch)).tokens[-1]
        )

    assert draw(1) == draw(5) == draw(9)
