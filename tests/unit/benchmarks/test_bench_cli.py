"""`stacx bench list / prepare / score` and `--compare`: what a user sees, one line per problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stacx.infra.cli import build_parser

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples"


def _run(*argv: str) -> int:
    args = build_parser().parse_args(["bench", *argv])
    return int(args.func(args))


def test_list_shows_every_suite_with_its_metric_and_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("list") == 0
    out = capsys.readouterr().out
    for name in ("terminal-bench-2", "seta", "swe-bench-verified", "kernelbench", "algotune", "gsm8k",
                 "math", "minervamath", "aime2024"):
        assert name in out
    assert "harmonic-mean speedup" in out and "'#### N'" in out
    assert "gsm8k, math-verify" in out and "math-is-equiv, math-verify" in out


def test_prepare_names_each_problem_in_one_line_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("prepare", "gsm8k", "--from", str(SAMPLES / "gsm8k")) == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == f"gsm8k: 3 tasks ready at {SAMPLES / 'gsm8k'}, 3 problem(s) above"
    assert len(captured.err.strip().splitlines()) == 3


def test_prepare_of_a_clean_copy_succeeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = (SAMPLES / "gsm8k" / "test.jsonl").read_text().splitlines()[:3]
    (tmp_path / "test.jsonl").write_text("\n".join(rows) + "\n")
    assert _run("prepare", "gsm8k", "--from", str(tmp_path)) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"gsm8k: 3 tasks ready at {tmp_path}" and captured.err == ""


def test_prepare_of_a_missing_path_or_an_unknown_suite_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("prepare", "gsm8k", "--from", "/no/such/dir") == 2
    assert capsys.readouterr().err.strip() == (
        "stacx bench: prepare: --from /no/such/dir: does not exist; see "
        "docs/benchmarks.md for what to download for gsm8k and where to put it")
    assert _run("prepare", "gsm9k", "--from", "/tmp") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stacx bench: prepare: 'gsm9k' is not a known benchmark suite") and "\n" not in err


def _result(tmp_path: Path, name: str, rewards: dict[str, list[float]], *, suite: str = "gsm8k") -> Path:
    tasks = {t: {"sample_rewards": [{"reward": r} for r in rs]} for t, rs in rewards.items()}
    path = tmp_path / name
    path.write_text(json.dumps({"suite": suite, "k": 2, "tasks": tasks}))
    return path


def test_score_recomputes_the_metric_and_compare_lists_the_changes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _result(tmp_path, "old.json", {"a": [0.0, 0.0], "b": [1.0, 1.0]})
    new = _result(tmp_path, "new.json", {"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 0.0]})
    scored = tmp_path / "scored.json"
    assert _run("score", "gsm8k", str(old), "--json", str(tmp_path / "old-scored.json")) == 0
    capsys.readouterr()
    previous = str(tmp_path / "old-scored.json")
    assert _run("score", "gsm8k", str(new), "--json", str(scored), "--compare", previous) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["value"] == pytest.approx((0.5 + 1 + 0) / 3) and summary["pass@2"] == pytest.approx(2 / 3)
    assert "accuracy: 0.5000 -> 0.5000 (+0.0000)" in captured.err
    assert "  a: pass@1 0.0000 -> 0.5000, pass@2 0.0000 -> 1.0000, passed 0.0000 -> 1.0000" in captured.err
    assert "  c: new task" in captured.err
    written = json.loads(scored.read_text())["tasks"]["a"]["sample_rewards"]
    assert written == [{"reward": 1.0}, {"reward": 0.0}]


def test_a_bad_result_file_or_another_suite_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    assert _run("score", "gsm8k", str(tmp_path / "bad.json")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stacx bench: score: {tmp_path / 'bad.json'}: not valid JSON")
    other = _result(tmp_path, "other.json", {"a": [1.0]}, suite="math")
    mine = _result(tmp_path, "mine.json", {"a": [1.0]})
    assert _run("score", "gsm8k", str(mine), "--compare", str(other)) == 2
    refused = f"{other}: holds suite 'math', not 'gsm8k'; compare results of the same suite"
    assert refused in capsys.readouterr().err


def test_run_refuses_a_sample_count_below_one_before_anything_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("run", "gsm8k", "unused.yaml", "--from", str(SAMPLES / "gsm8k"), "--samples", "0") == 2
    assert capsys.readouterr().err.strip() == "stacx bench: run: --samples 0: use a number >= 1"


def test_a_repeated_task_id_runs_once_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from stacx.infra.benchmarks import build_suite
    from stacx.infra.commands.bench import _unique

    tasks = build_suite("aime2024").load(SAMPLES / "aime2024").tasks
    assert [t.task_id for t in _unique([*tasks, tasks[0]])] == ["aime2024/60", "aime2024/61"]
    assert "task id 'aime2024/60' seen before" in capsys.readouterr().err


def test_the_suite_runs_with_one_evaluator_its_reward_always_and_its_scaffold_by_default() -> None:
    from stacx.infra.benchmarks import build_suite
    from stacx.infra.commands.bench import _evaluators

    gsm8k, kernels = build_suite("gsm8k"), build_suite("kernelbench")
    config = {"default": {"scaffold": "retool", "reward": "exact_answer", "max_turns": 3},
              "other": {"scaffold": "terminal"}}
    assert _evaluators(config, gsm8k, None, 4, "gsm8k_answer") == {
        "gsm8k": {"scaffold": "single_turn", "reward": "gsm8k_answer", "max_turns": 3,
                  "scaffold_options": {"answer_required": True}}}  # no box, no answer: 0
    own = {"gsm8k": {"scaffold": "retool", "reward": "exact_match"}}
    assert _evaluators(own, gsm8k, None, 1, "math_equivalent") == {
        "gsm8k": {"scaffold": "retool", "reward": "math_equivalent", "temperature": 0.0}}  # greedy
    assert _evaluators(own, gsm8k, "terminal", 2, "gsm8k_answer")["gsm8k"]["scaffold"] == "terminal"
    mine = {"gsm8k": {"scaffold": "single_turn", "scaffold_options": {"system_prompt": "Box it."}}}
    assert _evaluators(mine, gsm8k, None, 2, "gsm8k_answer")["gsm8k"]["scaffold_options"] == {
        "answer_required": True, "system_prompt": "Box it."}  # the suite's rule with the user's prompt
    assert _evaluators({}, kernels, None, 2, "verifier") == {
        "kernelbench": {"scaffold": "terminal", "reward": "verifier", "verifier": "kernelbench"}}


def test_a_math_suite_grades_by_its_own_rule_unless_grader_names_math_verify(
        capsys: pytest.CaptureFixture[str]) -> None:
    from stacx.infra.benchmarks import build_suite
    from stacx.infra.commands.bench import _grader

    math = build_suite("math")
    assert _grader(math, None) == ("math-is-equiv", "hendrycks_math_answer")
    assert _grader(math, "math-verify") == ("math-verify", "math_equivalent")
    assert _grader(math, "sympy") is None
    assert capsys.readouterr().err.strip() == (
        "stacx bench: run: --grader sympy: math has no such grader; use one of: math-is-equiv, math-verify")
    assert _grader(build_suite("kernelbench"), None) == ("suite", "verifier")
    assert _grader(build_suite("kernelbench"), "math-verify") is None
    assert "none: kernelbench has one grader" in capsys.readouterr().err
