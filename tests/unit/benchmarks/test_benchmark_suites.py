"""Each suite adapter on small samples in the suite's published layout (tests/benchmark_samples),
malformed rows included: one line each naming the file and row; and each suite's scoring rule on
per-sample reward components worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harbor_cookbook import cookbook

from stacx.infra.benchmarks import BENCHMARKS, TaskOutcome, build_suite
from stacx.rollout.rewards import get_reward
from stacx.schemas.plugins import PluginError

SAMPLES = Path(__file__).resolve().parents[2] / "benchmark_samples"


def test_at_least_six_suites_register_through_the_benchmarks_point() -> None:
    names = BENCHMARKS.names()
    for name in ("terminal-bench-2", "seta", "swe-bench-verified", "kernelbench", "algotune",
                 "gsm8k", "math", "minervamath", "aime2024"):
        assert name in names
        suite = build_suite(name)
        assert suite.metric and suite.layout and suite.task_type == name


class UserSuite:
    """A user's suite by dotted path, as a shipped one."""

    name = metric = layout = task_type = "user"
    scaffold, reward = "single_turn", "exact_answer"

    def prepare(self, path: Path) -> list[str]:
        return []

    def load(self, path: Path):  # type: ignore[no-untyped-def]
        return build_suite("gsm8k").load(path)

    def score(self, outcomes, *, k):  # type: ignore[no-untyped-def]
        return build_suite("gsm8k").score(outcomes, k=k)


def test_a_user_suite_resolves_by_dotted_path_and_a_bad_name_is_one_line() -> None:
    assert build_suite(f"{__name__}:UserSuite").name == "user"
    with pytest.raises(PluginError, match="'nope' is not a known benchmark suite; use one of"):
        build_suite("nope")


def _problems_by_line(problems: list[str]) -> dict[str, str]:
    return {line.split(": ", 1)[0].rsplit("/", 1)[-1]: line for line in problems}


def test_gsm8k_reads_the_final_answer_after_the_marker_and_skips_bad_rows() -> None:
    loaded = build_suite("gsm8k").load(SAMPLES / "gsm8k")
    answers = [json.loads(t.data)["answer"] for t in loaded.tasks]
    assert answers == ["12", "2400", "3"]  # the thousands separator is dropped
    assert loaded.tasks[0].prompt.startswith("Ann has 3 boxes") and "\\boxed{}" in loaded.tasks[0].prompt
    assert loaded.tasks[0].task_id == "gsm8k/test-0" and loaded.tasks[0].task_type == "gsm8k"
    problems = _problems_by_line(loaded.problems)
    assert sorted(problems) == ["test.jsonl:4", "test.jsonl:5", "test.jsonl:6"]
    assert "does not end in '#### <number>'" in problems["test.jsonl:4"]
    assert "no `question` text" in problems["test.jsonl:5"]
    assert "not valid JSON" in problems["test.jsonl:6"]


def test_math_takes_the_last_boxed_answer_or_the_answer_field() -> None:
    loaded = build_suite("math").load(SAMPLES / "math" / "test.jsonl")
    assert [json.loads(t.data)["answer"] for t in loaded.tasks] == ["\\frac{3}{4}", "5", "9"]
    problems = _problems_by_line(loaded.problems)
    assert "no \\boxed{} in `solution`" in problems["test.jsonl:4"]
    assert "not an object" in problems["test.jsonl:5"]


def test_minervamath_rows_and_an_empty_question() -> None:
    loaded = build_suite("minervamath").load(SAMPLES / "minervamath")
    assert [json.loads(t.data)["answer"] for t in loaded.tasks] == ["5", "1024"]
    assert len(loaded.problems) == 1 and "test.jsonl:3: no `question` or `problem` text" in loaded.problems[0]


def test_aime2024_reads_parquet_with_either_capitalisation(tmp_path: Path) -> None:
    table = pa.table({"ID": ["2024-I-1", "2024-I-2", "2024-I-3"],
                      "Problem": ["Find n.", "Find m.", None],
                      "Answer": [204, 25, 7]})
    pq.write_table(table, tmp_path / "aime_2024.parquet")
    loaded = build_suite("aime2024").load(tmp_path)
    assert [t.task_id for t in loaded.tasks] == ["aime2024/2024-I-1", "aime2024/2024-I-2"]
    assert [json.loads(t.data)["answer"] for t in loaded.tasks] == ["204", "25"]
    file = tmp_path / "aime_2024.parquet"
    assert loaded.problems == [f"{file}: row 2: no `problem` or `Problem` text; skipped"]


def test_a_missing_or_unreadable_file_is_one_line(tmp_path: Path) -> None:
    suite = build_suite("aime2024")
    assert suite.prepare(tmp_path) == [
        f"{tmp_path}: no .jsonl, .json or .parquet file; point --from at "
        "the aime2024 file (Parquet/JSONL rows: problem|Problem, answer|Answer, id|ID)"]
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    [line] = suite.prepare(tmp_path)
    assert line.startswith(f"{tmp_path / 'x.parquet'}: not a readable Parquet file")


def test_math_suites_score_with_math_verify_equivalence() -> None:
    reward = get_reward("math_equivalent")
    assert reward("0.75", {"answer": "\\frac{3}{4}"})["reward"] == 1.0
    assert reward("\\boxed{5}", {"answer": "5"})["reward"] == 1.0
    assert reward("2,400", {"answer": "2400"})["reward"] == 1.0
    assert reward("6", {"answer": "5"})["reward"] == 0.0
    assert reward("}}{{\\frac", {"answer": "5"}) == {"reward": 0.0, "answered": 1.0}  # garbage scores 0
    assert reward(None, {"answer": "5"}) == {"reward": 0.0, "answered": 0.0}


def test_math_accuracy_greedy_and_pass_at_k_by_hand() -> None:
    outcomes = [TaskOutcome("a", [{"reward": 1.0}, {"reward": 0.0}, {"reward": 0.0}, {"reward": 0.0}]),
                TaskOutcome("b", [{"reward": 0.0}] * 4),
                TaskOutcome("c", [{"reward": 1.0}] * 4)]
    score = build_suite("gsm8k").score(outcomes, k=2)
    assert score.metric == "accuracy" and score.interval_method == "wilson"
    assert score.value == pytest.approx((0.25 + 0 + 1) / 3)  # pass@1 = mean c/n per task
    assert score.extra["pass@2"] == pytest.approx((0.5 + 0 + 1) / 3)  # a: 1 - C(3,2)/C(4,2)
    assert score.per_task["a"] == {"samples": 4.0, "passed": 1.0, "pass@1": 0.25, "pass@2": 0.5}
    greedy = build_suite("gsm8k").score([TaskOutcome("a", [{"reward": 1.0}]),
                                          TaskOutcome("b", [{"reward": 0.0}]),
                                          TaskOutcome("c", [{"reward": 1.0}])], k=1)
    assert greedy.value == pytest.approx(2 / 3) and "pass@2" not in greedy.extra
    assert greedy.interval == pytest.approx((0.2077, 0.9385), abs=1e-4)


def test_harbor_suites_take_the_task_folders_and_skip_the_unsupported() -> None:
    for name in ("terminal-bench-2", "seta"):
        loaded = build_suite(name).load(cookbook())
        assert "simple-task" in [t.task_id for t in loaded.tasks]
        assert {t.task_type for t in loaded.tasks} == {name} and all(t.task_dir for t in loaded.tasks)
        assert any(line.startswith(f"{cookbook() / 'multi-container'}: ") and "not supported" in line
                   for line in loaded.problems)


def test_harbor_tasks_are_grouped_by_their_metadata_difficulty() -> None:
    loaded = build_suite("terminal-bench-2").load(cookbook())
    groups = {t.task_id: t.metadata.get("group") for t in loaded.tasks}
    assert groups["harbor-hello-multi-step-full"] == "easy"  # [metadata] difficulty = "easy"
    assert groups["simple-task"] is None  # no difficulty: no group


def test_a_broken_harbor_task_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "task.toml").write_text("version = [unclosed\n")
    loaded = build_suite("terminal-bench-2").load(tmp_path)
    assert loaded.tasks == [] and len(loaded.problems) == 1
    assert loaded.problems[0].startswith(f"{tmp_path / 'broken'}: ") and "\n" not in loaded.problems[0]
    [line] = build_suite("seta").prepare(tmp_path / "broken" / "task.toml")
    assert line.endswith("not a folder; point --from at the seta task folders")


def test_harbor_reports_the_mean_reward_with_partial_rewards_and_the_success_rate() -> None:
    outcomes = [TaskOutcome("t1", [{"reward": 1.0}]), TaskOutcome("t2", [{"reward": 0.5}]),
                TaskOutcome("t3", [{"reward": 0.0}]), TaskOutcome("t4", [{"reward": 0.9999999999999}])]
    score = build_suite("terminal-bench-2").score(outcomes, k=1)
    assert score.metric == "mean reward" and score.value == pytest.approx(2.5 / 4)  # Harbor's Mean
    assert score.extra["success rate (reward 1)"] == pytest.approx(2 / 4)
    assert score.per_task["t2"]["mean reward"] == 0.5 and score.interval_method == "bootstrap"