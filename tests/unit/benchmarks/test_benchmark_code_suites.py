"""SWE-bench Verified, KernelBench and AlgoTune: conversion of their published layouts (samples
in tests/benchmark_samples, malformed ones included) and their scoring rules by hand."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stacx.infra.benchmarks import TaskOutcome, build_suite
from stacx.infra.benchmarks.swebench import parse_pytest_report, resolved, swebench_verifier
from stacx.rollout.protocols import ExecResult

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples"


def test_swebench_instances_become_tasks_with_their_test_lists_and_image() -> None:
    loaded = build_suite("swe-bench-verified").load(SAMPLES / "swe-bench-verified")
    first, second = loaded.tasks
    assert first.task_id == "acme__widgets-101" and first.image == "sweb.eval.x86_64.acme__widgets-101:latest"
    data = json.loads(first.data)
    assert data["FAIL_TO_PASS"] == ["tests/test_core.py::test_new"]  # a JSON-encoded list, decoded
    assert data["PASS_TO_PASS"] == ["tests/test_core.py::test_old"]
    assert json.loads(second.data)["FAIL_TO_PASS"] == ["t/test_g.py::test_round"]  # a plain list
    assert "Widgets crash on empty input." in first.prompt
    line3, line4 = loaded.problems
    assert line3.endswith("test.jsonl:3: missing field(s) ['base_commit', 'test_patch', 'FAIL_TO_PASS', "
                          "'PASS_TO_PASS']; an instance has ['instance_id', 'repo', 'base_commit', "
                          "'problem_statement', 'test_patch', 'FAIL_TO_PASS', 'PASS_TO_PASS']; skipped")
    assert line4.endswith("test.jsonl:4: FAIL_TO_PASS is not a list of test ids "
                          "(nor a JSON-encoded one); skipped")


def test_the_resolved_rule_needs_every_fail_to_pass_and_pass_to_pass_test() -> None:
    f2p, p2p = ["t::a", "t::b"], ["t::c"]
    assert resolved(f2p, p2p, {"t::a": "PASSED", "t::b": "PASSED", "t::c": "PASSED"})
    assert not resolved(f2p, p2p, {"t::a": "PASSED", "t::b": "PASSED", "t::c": "FAILED"})  # a regression
    assert not resolved(f2p, p2p, {"t::a": "PASSED", "t::c": "PASSED"})  # a test missing from the report
    assert not resolved(f2p, p2p, {"t::a": "PASSED", "t::b": "ERROR", "t::c": "PASSED"})


def test_a_pytest_short_summary_parses_into_statuses() -> None:
    report = ("==== short test summary info ====\nPASSED tests/test_core.py::test_old\n"
              "FAILED tests/test_core.py::test_new - AssertionError\nERROR t/x.py::test_e\n"
              "==== 1 failed ====")
    assert parse_pytest_report(report) == {
        "tests/test_core.py::test_old": "PASSED",
        "tests/test_core.py::test_new": "FAILED",
        "t/x.py::test_e": "ERROR",
    }


@dataclass
class ScriptedSession:
    """A sandbox session fake: canned results per command prefix, commands recorded."""

    replies: dict[str, ExecResult]
    session_id: str = "fake"
    commands: list[tuple[str, str | None]] = field(default_factory=list)

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        self.commands.append((command, stdin))
        return next(r for key, r in self.replies.items() if key in command)

    async def verify(self) -> dict[str, float]:
        raise AssertionError("the swebench verifier runs its own tests")

    async def close(self) -> None:
        return None


async def test_the_swebench_verifier_applies_the_test_patch_and_scores_the_report() -> None:
    task = build_suite("swe-bench-verified").load(SAMPLES / "swe-bench-verified").tasks[0]
    report = "PASSED tests/test_core.py::test_new\nPASSED tests/test_core.py::test_old\n"
    session = ScriptedSession({"git apply": ExecResult(exit_code=0),
                               "pytest": ExecResult(exit_code=0, stdout=report)})
    assert await swebench_verifier(session, task) == {"reward": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0,
                                                      "patch_applied": 1.0}
    assert session.commands[0] == ("cd /testbed && git apply -v -", json.loads(task.data)["test_patch"])
    assert session.commands[1][0] == "cd /testbed && python -m pytest -rA tests/test_core.py"
    broken = ScriptedSession({"git apply": ExecResult(exit_code=1), "pytest": ExecResult(exit_code=0)})
    assert (await swebench_verifier(broken, task))["reward"] == 0.0 and len(broken.commands) == 1


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
