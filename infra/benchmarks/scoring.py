"""How suites turn episodes into their metric: pass rates (first sample, pass@k) with a Wilson
interval, and speedups with a bootstrap interval. Shared by the adapters; each suite picks one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stacx.infra.benchmarks.protocols import SuiteScore, TaskOutcome
from stacx.infra.benchmarks.stats import bootstrap_interval, pass_at_k, wilson_interval

__all__ = ["SUCCESS", "mean_reward_score", "passed", "rate_score"]

SUCCESS = 1.0 - 1e-9
"""A sample passes when its reward is 1 (a float written by a verifier may be 0.9999999999)."""


def passed(sample: dict[str, float]) -> bool:
    """True when the episode scored full reward."""
    return sample.get("reward", 0.0) >= SUCCESS


def rate_score(
    outcomes: Sequence[TaskOutcome],
    *,
    metric: str,
    k: int,
    success: Callable[[dict[str, float]], bool] = passed,
) -> SuiteScore:
    """The suite's rate: per task the fraction of samples that pass (pass@1, unbiased; with one
    sample per task, greedy accuracy), averaged over tasks, with a Wilson interval over tasks.
    With `k` > 1 it also reports pass@k (the unbiased estimator); a task with fewer than k
    samples (episodes lost or timed out) counts the missing ones as failures."""
    per_task: dict[str, dict[str, float]] = {}
    for outcome in outcomes:
        n = len(outcome.samples)
        c = sum(1 for s in outcome.samples if success(s))
        row = {"samples": float(n), "passed": float(c), "pass@1": c / n if n else 0.0}
        if k > 1:
            row[f"pass@{k}"] = pass_at_k(max(n, k), c, k)
        per_task[outcome.task_id] = row
    num_tasks = len(per_task)
    total = sum(row["pass@1"] for row in per_task.values())
    value = total / num_tasks if num_tasks else 0.0
    extra: dict[str, float] = {"tasks": float(num_tasks)}
    best = [row[f"pass@{k}"] for row in per_task.values() if f"pass@{k}" in row]
    if k > 1 and best:
        extra[f"pass@{k}"] = sum(best) / len(best)
        low, high = wilson_interval(sum(best), len(best))
        extra[f"pass@{k} low"], extra[f"pass@{k} high"] = low, high
    return SuiteScore(
        metric=metric,
        value=value,
        interval=wilson_interval(total, num_tasks),
        interval_method="wilson",
        extra=extra,
        per_task=per_task,
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def mean_reward_score(outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
    """Harbor's metric (`harbor.metrics.Mean`): the mean reward of every trial, partial rewards
    kept (a task's samples averaged, then the tasks), with a bootstrap interval over tasks; the
    success rate (reward 1) and pass@k as further figures."""
    rates = rate_score(outcomes, metric="success rate", k=k)
    per_task = {}
    for outcome in outcomes:
        rewards = [s.get("reward", 0.0) for s in outcome.samples]
        per_task[outcome.task_id] = {**rates.per_task[outcome.task_id], "mean reward": _mean(rewards)}
    means = [row["mean reward"] for row in per_task.values()]
    return SuiteScore(
        metric="mean reward",
        value=_mean(means),
        interval=bootstrap_interval(means, _mean),
        interval_method="bootstrap",
        extra={**rates.extra, "success rate (reward 1)": rates.value},
        per_task=per_task,
    )
