"""The suites' figures as the suites compute them: KernelBench's fast_p and geometric means on
its own published reference cases, unbiased best-of-k (never the first k to finish), the order
--limit takes, a single level folder, per-level figures, and a denominator that keeps skipped,
--limit-cut and lost tasks as failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stacx.infra.benchmarks import TaskOutcome, build_suite
from stacx.infra.benchmarks.kernelbench import FAST_P
from stacx.infra.benchmarks.report import denominator, group_scores, outcomes_of, result_document
from stacx.infra.benchmarks.stats import expected_best_of_k
from stacx.infra.commands.bench import NOT_RUN, _not_run, _padded

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples"

# ScalingIntelligence/KernelBench, src/kernelbench/unit_tests/test_score.py: (is_correct,
# baseline_speed, actual_speed) with its published geometric means and fast_p values
KERNELBENCH_CASES = [
    ([1, 0, 1, 1, 0], [0.1, 0.15, 0.2, 0.05, 0.3], [0.2, 0.15, 0.3, 0.01, 0.2],
     {"correct_only": 1.185631101, "correct_and_faster": 5.0, 1.0: 0.2, 0.5: 0.4}),
    ([1, 1, 1, 1, 0], [0.24, 0.31, 100.0, 0.0001, 0.3], [0.3, 0.3, 200.0, 0.0001, 0.3],
     {"correct_only": 0.801816719, "correct_and_faster": 1.033333333, 1.0: 0.2, 0.5: 0.6}),
    ([0, 0, 0, 0, 0], [0.1, 0.15, 0.2, 0.05, 0.3], [0.2, 0.15, 0.3, 0.01, 0.2],
     {"correct_only": 0.0, "correct_and_faster": 0.0, 1.0: 0.0, 0.5: 0.0}),
]


@pytest.mark.parametrize(("is_correct", "baseline", "actual", "published"), KERNELBENCH_CASES)
def test_kernelbench_figures_reproduce_its_published_score_cases(
        is_correct: list[int], baseline: list[float], actual: list[float],
        published: dict[object, float]) -> None:
    outcomes = [TaskOutcome(f"level1/{i}", [{"correct": float(c), "speedup": b / a}])
                for i, (c, b, a) in enumerate(zip(is_correct, baseline, actual, strict=True))]
    extra = build_suite("kernelbench").score(outcomes, k=1).extra
    assert extra["speedup (geometric mean, correct)"] == pytest.approx(published["correct_only"], abs=1e-7)
    assert extra["speedup (geometric mean, correct and faster)"] == pytest.approx(
        published["correct_and_faster"], abs=1e-7)
    assert extra["fast_1"] == pytest.approx(published[1.0])
    assert extra["fast_0.5"] == pytest.approx(published[0.5])
    assert FAST_P == (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)  # the p KernelBench's analysis script reports


def test_best_of_k_below_the_samples_is_the_unbiased_estimate_not_the_first_k() -> None:
    # 4 samples, the two that finished first wrong: the first 2 give 0.0, the estimate 0.833
    samples = [{"correct": 0.0, "speedup": 0.0}] * 2 + [{"correct": 1.0, "speedup": 2.0}] * 2
    row = build_suite("kernelbench").score([TaskOutcome("level1/1", samples)], k=2).per_task["level1/1"]
    assert row["correct"] == pytest.approx(5 / 6) and row["fast_1"] == pytest.approx(5 / 6)
    assert row["speedup"] == pytest.approx(2.0 * 5 / 6)  # best of 2: 2.0 unless both are wrong (0)
    valid = [{"valid": 0.0, "speedup": 0.0}] * 2 + [{"valid": 1.0, "speedup": 3.0}] * 2
    tuned = build_suite("algotune").score([TaskOutcome("t", valid)], k=2).per_task["t"]
    assert tuned["valid"] == pytest.approx(5 / 6) and tuned["speedup"] == pytest.approx(1 + 2 * 5 / 6)
    assert expected_best_of_k([1.0, 2.0, 3.0], 3) == 3.0 and expected_best_of_k([1.0, 2.0, 3.0], 1) == 2.0


def test_math_pass_at_k_counts_lost_samples_as_failures() -> None:
    score = build_suite("gsm8k").score([TaskOutcome("a", [{"reward": 1.0}])], k=4)  # 3 lost
    assert score.per_task["a"]["pass@4"] == 1.0  # one of four passed: best of 4 passes
    score = build_suite("gsm8k").score([TaskOutcome("a", [{"reward": 0.0}]), TaskOutcome("b", [])], k=2)
    assert score.per_task["b"]["pass@2"] == 0.0 and score.extra["pass@2"] == 0.0


def _level(tmp_path: Path, name: str, numbers: list[int]) -> Path:
    source = (SAMPLES / "kernelbench" / "KernelBench" / "level1" / "1_Scaled_add.py").read_text()
    folder = tmp_path / "KernelBench" / name
    folder.mkdir(parents=True)
    for n in numbers:
        (folder / f"{n}_Problem.py").write_text(source)
    return folder


def test_kernelbench_order_is_the_suites_and_one_level_folder_loads(tmp_path: Path) -> None:
    _level(tmp_path, "level1", [1, 2, 10, 11])
    _level(tmp_path, "level10", [1])
    level2 = _level(tmp_path, "level2", [3])
    suite = build_suite("kernelbench")
    ids = [t.task_id for t in suite.load(tmp_path).tasks]
    assert ids == ["level1/1_Problem", "level1/2_Problem", "level1/10_Problem", "level1/11_Problem",
                   "level2/3_Problem", "level10/1_Problem"]  # --limit 2 takes problems 1 and 2
    assert [t.task_id for t in suite.load(level2).tasks] == ["level2/3_Problem"]
    assert {t.metadata["group"] for t in suite.load(tmp_path).tasks} == {"level1", "level2", "level10"}


def test_kernelbench_reports_each_level_as_well_as_all() -> None:
    suite = build_suite("kernelbench")
    outcomes = [TaskOutcome("level1/1", [{"correct": 1.0, "speedup": 2.0}], "level1"),
                TaskOutcome("level1/2", [{"correct": 0.0, "speedup": 0.0}], "level1"),
                TaskOutcome("level2/1", [{"correct": 1.0, "speedup": 0.5}], "level2")]
    groups = group_scores(suite, outcomes, k=1)
    assert list(groups) == ["level1", "level2"]
    assert groups["level1"].value == 0.5 and groups["level1"].extra["fast_1"] == 0.5
    assert groups["level2"].value == 1.0 and groups["level2"].extra["fast_1"] == 0.0
    doc = result_document("kernelbench", suite.score(outcomes, k=1), outcomes, k=1, groups=groups)
    assert doc["groups"]["level1"]["value"] == 0.5 and doc["tasks"]["level2/1"]["group"] == "level2"
    again = outcomes_of(json.loads(json.dumps(doc)), where="r.json")  # `stacx bench score` keeps them
    assert [o.group for o in again] == ["level1", "level1", "level2"]


def test_skipped_cut_and_lost_tasks_stay_in_the_denominator_as_failures() -> None:
    tasks = build_suite("aime2024").load(SAMPLES / "aime2024").tasks
    outcomes = [TaskOutcome(tasks[0].task_id, _padded([{"reward": 1.0}], 2))]  # one sample lost
    outcomes += _not_run(tasks[1:], ["data/test.jsonl:3: no `answer` field; skipped"], 2)
    assert outcomes[0].samples == [{"reward": 1.0}, NOT_RUN]
    assert [o.task_id for o in outcomes[1:]] == [tasks[1].task_id, "skipped:data/test.jsonl:3"]
    score = build_suite("aime2024").score(outcomes, k=2)
    assert score.value == pytest.approx(0.5 / 3) and score.extra["tasks"] == 3.0
    assert denominator(outcomes) == {"denominator": 3, "tasks not run (failures)": 2}
    kernels = build_suite("kernelbench").score(_not_run(tasks, [], 1), k=1)
    assert kernels.value == 0.0 and kernels.extra["tasks"] == float(len(tasks))
    tuned = build_suite("algotune").score(_not_run(tasks, [], 1), k=1)
    assert tuned.value == 1.0  # AlgoTune scores a task with no valid solver as the baseline
