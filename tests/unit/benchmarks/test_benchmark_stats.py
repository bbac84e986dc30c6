"""The statistics behind every suite metric, against values worked out by hand."""

from __future__ import annotations

import pytest

from stacx.infra.benchmarks.stats import (
    bootstrap_interval,
    geometric_mean,
    harmonic_mean,
    pass_at_k,
    wilson_interval,
)


def test_wilson_interval_of_two_in_three() -> None:
    # p = 2/3, n = 3, z = 1.96: centre (p + z^2/2n) / (1 + z^2/n) = 0.5731, half-width 0.3654
    low, high = wilson_interval(2, 3)
    assert low == pytest.approx(0.2077, abs=1e-4) and high == pytest.approx(0.9385, abs=1e-4)


def test_wilson_interval_at_the_edges_stays_inside_zero_one() -> None:
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(0, 0) == (0.0, 0.0)


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k failures: every k-subset holds a pass
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="at least 4 samples"):
        pass_at_k(2, 1, 4)


def test_harmonic_and_geometric_means() -> None:
    assert harmonic_mean([1.0, 2.0, 4.0]) == pytest.approx(3 / 1.75)
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert harmonic_mean([]) == 0.0 and geometric_mean([]) == 0.0


def test_bootstrap_interval_is_seeded_and_brackets_the_statistic() -> None:
    values = [1.0, 1.5, 2.0, 3.0, 8.0]
    low, high = bootstrap_interval(values, harmonic_mean)
    assert low <= harmonic_mean(values) <= high and low >= 1.0 and high <= 8.0
    assert bootstrap_interval(values, harmonic_mean) == (low, high)
    assert bootstrap_interval([2.0, 2.0], harmonic_mean) == (2.0, 2.0)
