"""The statistics a benchmark report prints: rates with a Wilson score interval, speedups with
a percentile-bootstrap interval, the unbiased pass@k estimator, the harmonic mean.

Legend: `n` samples of one task, `c` of them correct; `k` the best-of-k budget.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "Interval",
    "bootstrap_interval",
    "expected_best_of_k",
    "geometric_mean",
    "harmonic_mean",
    "pass_at_k",
    "wilson_interval",
]

Z_95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95 % interval."""

Interval = tuple[float, float]


def wilson_interval(successes: float, trials: int, *, z: float = Z_95) -> Interval:
    """The Wilson score interval of a rate `successes / trials` (95 % by default).

    `successes` may be fractional (a sum of per-task rates, e.g. pass@k estimates); the interval
    then treats each task as one trial with that rate."""
    if trials <= 0:
        return (0.0, 0.0)
    p = min(1.0, max(0.0, successes / trials))
    denominator = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` samples of which `c` passed (Chen et al., 2021):
    1 - C(n-c, k) / C(n, k); needs n >= k."""
    if not 0 < k <= n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task (got {n})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def expected_best_of_k(values: Sequence[float], k: int) -> float:
    """The unbiased estimate of the best of `k` samples drawn without replacement from the
    `values` of n >= k samples: sum over the sorted values v_(1) <= ... <= v_(n) of
    v_(i) * C(i-1, k-1) / C(n, k) (the order statistic of Chen et al.'s pass@k, for numbers)."""
    n = len(values)
    if not 0 < k <= n:
        raise ValueError(f"best-of-{k} needs at least {k} samples per task (got {n})")
    ordered = sorted(values)
    return sum(v * math.comb(i, k - 1) for i, v in enumerate(ordered)) / math.comb(n, k)


def harmonic_mean(values: Sequence[float]) -> float:
    """The harmonic mean of positive values (0 for none)."""
    return statistics.harmonic_mean(values) if values else 0.0


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float],
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """The percentile-bootstrap interval of `statistic` over `values` resampled with replacement
    (seeded: the same values give the same interval)."""
    if not values:
        return (0.0, 0.0)
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(data), size=(resamples, len(data)))  # [R, N]
    estimates = np.array([statistic(list(data[row])) for row in picks])
    tail = (1.0 - level) / 2
    return (float(np.quantile(estimates, tail)), float(np.quantile(estimates, 1.0 - tail)))


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean of positive values (0 for none)."""
    return statistics.geometric_mean(values) if values else 0.0
