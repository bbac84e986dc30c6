"""How a run ends: failed episodes beyond `pipeline.max_failed_fraction` fail it with the figure
in report.json, held-out success counts episodes that reach `success_reward`, and report.json
is strict JSON whatever the figures hold."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stacx.consumers.assembly.testing import make_trajectory
from stacx.infra.pipeline.errors import PipelineError
from stacx.infra.pipeline.evaluation import _summarise
from stacx.infra.pipeline.monitor import RunMetrics
from stacx.infra.pipeline.orchestrator import Pipeline
from stacx.infra.pipeline.report import write_report
from stacx.schemas.records import TrajectoryStatus


def _metrics(failed: int, ok: int) -> RunMetrics:
    metrics = RunMetrics()
    for index in range(failed):
        trajectory = make_trajectory(f"f{index}", 0, status=TrajectoryStatus.FAILED)
        metrics.observe_trajectory(dataclasses.replace(trajectory, error="EnvironmentError: sandbox gone"))
    for index in range(ok):
        metrics.observe_trajectory(make_trajectory(f"o{index}", 0))
    return metrics


def _pipeline(metrics: RunMetrics, max_failed_fraction: float = 0.2) -> Any:
    return SimpleNamespace(metrics=metrics, cfg=SimpleNamespace(max_failed_fraction=max_failed_fraction))


def test_a_run_whose_episodes_fail_beyond_the_threshold_fails_with_the_figure() -> None:
    run = _pipeline(_metrics(failed=60, ok=60))
    with pytest.raises(PipelineError) as info:
        Pipeline._check_failed_episodes(run)
    assert str(info.value) == ("60 of 120 training episodes failed (50% > pipeline.max_failed_fraction=0.2): "
                               "60x EnvironmentError: sandbox gone")
    figures = Pipeline._failure_figures(run)
    assert figures == {"failed_episodes": 60, "failed_fraction": 0.5, "max_failed_fraction": 0.2,
                       "failure_reasons": {"EnvironmentError: sandbox gone": 60}}


def test_failures_within_the_threshold_end_the_run_normally() -> None:
    Pipeline._check_failed_episodes(_pipeline(_metrics(failed=2, ok=18)))
    Pipeline._check_failed_episodes(_pipeline(_metrics(failed=0, ok=0)))


def test_heldout_success_counts_episodes_reaching_success_reward_not_the_mean_reward() -> None:
    partial = [make_trajectory(f"p{i}", 0, reward=0.12) for i in range(30)]
    result = _summarise(partial, version=3, started=time.monotonic(), success_reward=1.0)
    assert (result.success, round(result.mean_reward, 2), result.num_episodes) == (0.0, 0.12, 30)
    mixed = [make_trajectory("a", 0, reward=1.0), make_trajectory("b", 0, reward=0.5)]
    assert _summarise(mixed, version=3, started=time.monotonic(), success_reward=0.5).success == 1.0
    assert _summarise(mixed, version=3, started=time.monotonic(), success_reward=1.0).success == 0.5


def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_report_json_is_strict_json_even_with_nan_and_inf(tmp_path: Path) -> None:
    report = {"success_after": float("nan"), "curve": [{"mean_reward": float("inf")}, {"x": 1.5}],
              "pair": (float("-inf"), 2)}
    path = write_report(tmp_path / "report.json", report)
    assert _strict(path.read_text()) == {"success_after": None, "curve": [{"mean_reward": None}, {"x": 1.5}],
                                         "pair": [None, 2]}
