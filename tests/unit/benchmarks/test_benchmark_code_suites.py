"""KernelBench and AlgoTune: conversion of their published layouts (samples
in tests/benchmark_samples, malformed ones included) and their scoring rules by hand (SWE-bench:
test_swebench_grading.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.infra.benchmarks import TaskOutcome, build_suite

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples"


def test_kernelbench_reads_the_level_folders_and_skips_a_file_without_inputs() -> None:
    loaded = build_suite("kernelbench").load(SAMPLES / "kernelbench")
    assert [t.task_id for t in loaded.tasks] == ["level1/1_Scaled_add", "level2/1_Relu_sum"]
    assert "class Model(nn.Module)" in loaded.tasks[0].prompt and "ModelNew" in loaded.tasks[0].prompt
    [problem] = loaded.problems
    assert "2_No_inputs.py: lacks 'def get_inputs', 'def get_init_inputs'" in problem
    assert build_suite("kernelbench").prepare(SAMPLES / "gsm8k")[0].endswith(
        "no KernelBench/level1 .. level4 folders; point --from at a checkout of the KernelBench repository "
        "or one level folder")


def test_kernelbench_correctness_first_then_speedup_by_hand() -> None:
    outcomes = [TaskOutcome("a", [{"correct": 1.0, "speedup": 2.0}]),
                TaskOutcome("b", [{"correct": 0.0, "speedup": 9.0}]),  # fast but wrong: no credit
                TaskOutcome("c", [{"correct": 1.0, "speedup": 0.5}])]
    score = build_suite("kernelbench").score(outcomes, k=1)
    assert score.value == pytest.approx(2 / 3) and score.extra["fast_1"] == pytest.approx(1 / 3)
    assert score.extra["speedup (geometric mean, correct)"] == pytest.approx(1.0)  # sqrt(2 * 0.5)
    best = build_suite("kernelbench").score(
        [TaskOutcome("b", [{"correct": 0.0, "speedup": 9.0}, {"correct": 1.0, "speedup": 1.5}])], k=2)
    assert best.per_task["b"] == {"samples": 2.0, "correct": 1.0, "speedup": 1.5, "fast_0": 1.0,
                                  "fast_0.5": 1.0, "fast_0.8": 1.0, "fast_1": 1.0, "fast_1.5": 0.0,
                                  "fast_2": 0.0}


def test_algotune_reads_task_folders_and_skips_one_without_its_solver() -> None:
    loaded = build_suite("algotune").load(SAMPLES / "algotune")
    assert [t.task_id for t in loaded.tasks] == ["vector_norm"]
    assert "Euclidean norm" in loaded.tasks[0].prompt and "def is_solution" in loaded.tasks[0].prompt
    [problem] = loaded.problems
    assert "no_solver: missing no_solver.py; an AlgoTune task has description.txt and no_solver.py" in problem


def test_algotune_score_is_the_harmonic_mean_with_invalid_or_slower_as_one() -> None:
    outcomes = [TaskOutcome("a", [{"valid": 1.0, "speedup": 2.0}]),
                TaskOutcome("b", [{"valid": 0.0, "speedup": 5.0}]),  # invalid: 1.0
                TaskOutcome("c", [{"valid": 1.0, "speedup": 0.5}])]  # slower: 1.0
    score = build_suite("algotune").score(outcomes, k=1)
    assert score.metric == "AlgoTune score" and score.interval_method == "bootstrap"
    assert score.value == pytest.approx(3 / (1 / 2 + 1 + 1))
    assert [score.per_task[t]["speedup"] for t in "abc"] == [2.0, 1.0, 1.0]
    assert score.interval[0] <= score.value <= score.interval[1]
