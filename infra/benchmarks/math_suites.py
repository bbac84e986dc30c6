"""The math suites: GSM8K, MATH, MinervaMath and AIME 2024 as their authors publish them, scored
by accuracy, greedy (one sample per task) and best-of-k (pass@k, the unbiased estimator).

Each suite grades with its own rule by default (`math_grading`: GSM8K's final number, MATH's
`is_equiv`, Minerva's normalisation, AIME's integer) on the episode's last `\\boxed{}`,
`\\fbox{}` or `<answer>`; `math-verify` is the alternative grader of every suite.

Published layouts (JSON Lines, a JSON array, one JSON object per file, or Parquet; a folder: its
test split, the files named `test*` or under a `test/` folder):
- GSM8K: `question`, `answer` ending in `#### <number>` (a folder with `main/` reads `main/` only:
  `socratic/` holds the same problems);
- MATH: `problem`, `solution` with the answer in the last `\\boxed{}` / `\\fbox{}` (or an
  `answer` field), `level`; the release's `test/<subject>/<n>.json` files included;
- MinervaMath: `question` (or `problem`), `answer` (or `solution` with `\\boxed{}`);
- AIME 2024: `problem`/`Problem`, `answer`/`Answer`, `id`/`ID`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacx.infra.benchmarks import math_grading  # noqa: F401  (registers the suites' own graders)
from stacx.infra.benchmarks.protocols import LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS
from stacx.infra.benchmarks.rows import data_files, read_rows
from stacx.infra.benchmarks.scoring import rate_score
from stacx.rollout.scaffolds import extract_answer
from stacx.schemas.records import TaskSample

__all__ = ["MATH_VERIFY", "Aime2024", "Gsm8k", "MathHendrycks", "MathSuite", "Minerva"]

INSTRUCTION = "Solve the problem. Put your final answer within \\boxed{}."
_ID_FIELDS = ("id", "ID", "unique_id", "idx")
_ORIGIN = "builtin (stacx.infra.benchmarks.math_suites)"


MATH_VERIFY = "math-verify"
"""The alternative grader of every math suite: math-verify's equivalence (`math_equivalent`)."""


class MathSuite:
    """A question/answer suite; subclasses say which fields hold the question and the answer,
    and which grader is the suite's own (`graders`, the first is the default)."""

    name = "math-suite"
    metric = "accuracy, greedy and pass@k"
    layout = "JSONL / JSON / Parquet rows"
    scaffold = "single_turn"
    scaffold_options: dict[str, Any] = {"answer_required": True}
    """No `\\boxed{}` and no `<answer>`: no answer (the whole text is never graded)."""
    graders: dict[str, str] = {MATH_VERIFY: "math_equivalent"}
    """Grader name -> the reward that grades with it; the first is the suite's own."""
    question_fields: tuple[str, ...] = ("question", "problem")
    group_field: str | None = None
    """The row field that splits the figures (MATH's `level`), or None."""

    def __init__(self) -> None:
        self.task_type: str = self.name
        self.reward: str = next(iter(self.graders.values()))

    def gold(self, row: dict[str, Any]) -> str | None:
        """The reference answer of a row, or None when the row has none."""
        value = _first(row, ("answer", "Answer"))
        return None if value is None else str(value).strip() or None

    def missing_answer(self) -> str:
        return "no `answer` field"

    def load(self, path: Path) -> LoadedSuite:
        tasks: list[TaskSample] = []
        problems: list[str] = []
        files = data_files(path)
        if not files:
            return LoadedSuite([], [f"{path}: no .jsonl, .json or .parquet file; {self.fix()}"])
        for file in files:
            rows = list(read_rows(file))
            for index, (where, row) in enumerate(rows):
                # one object per file (MATH's release): the file's path names the task
                name = _relative_stem(file, path) if len(rows) == 1 and file.suffix == ".json" \
                    else f"{file.stem}-{index}"
                task = self._task(row, where, name) if isinstance(row, dict) else row
                if isinstance(task, TaskSample):
                    tasks.append(task)
                else:
                    problems.append(f"{where}: {task}")
        return LoadedSuite(tasks, problems)

    def fix(self) -> str:
        return f"point --from at the {self.name} file ({self.layout})"

    def _task(self, row: dict[str, Any], where: str, name: str) -> TaskSample | str:
        question = _first(row, self.question_fields)
        if not isinstance(question, str) or not question.strip():
            return f"no {' or '.join(f'`{f}`' for f in self.question_fields)} text; skipped"
        gold = self.gold(row)
        if gold is None:
            return f"{self.missing_answer()}; skipped"
        row_id = _first(row, _ID_FIELDS)
        task_id = f"{self.name}/{row_id if row_id is not None else name}"
        metadata = {"suite": self.name, "source": where}
        group = row.get(self.group_field) if self.group_field else None
        if group is not None and str(group).strip():
            metadata["group"] = _group_name(self.group_field or "", group)
        return TaskSample(
            task_id=task_id,
            task_type=self.task_type,
            prompt=f"{question.strip()}\n\n{INSTRUCTION}",
            data=json.dumps({"answer": gold}),
            metadata=metadata,
        )

    def prepare(self, path: Path) -> list[str]:
        return self.load(path).readiness(f"{path}: holds no rows; {self.fix()}")

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        return rate_score(outcomes, metric="accuracy", k=k)


def _first(row: dict[str, Any], fields: Sequence[str]) -> Any:
    return next((row[f] for f in fields if row.get(f) is not None), None)


def _relative_stem(file: Path, root: Path) -> str:
    """`test/algebra/1` for `<root>/test/algebra/1.json` (`1` when `root` is the file)."""
    relative = file.relative_to(root) if root.is_dir() else Path(file.name)
    return relative.with_suffix("").as_posix()


def _group_name(field: str, value: Any) -> str:
    """`Level 3` for MATH's `level` 3 or `Level 3`; the value itself otherwise."""
    text = str(value).strip()
    return f"Level {text}" if field == "level" and text.isdigit() else text


@BENCHMARKS.register("gsm8k", origin=_ORIGIN)
class Gsm8k(MathSuite):
    """GSM8K grade-school word problems (accuracy)."""

    name = "gsm8k"
    metric = "accuracy (GSM8K final number), greedy and pass@k"
    layout = "JSONL/Parquet rows: question, answer ending '#### N' (main/, not socratic/)"
    graders = {"gsm8k": "gsm8k_answer", MATH_VERIFY: "math_equivalent"}
    question_fields = ("question",)

    def load(self, path: Path) -> LoadedSuite:
        # the Hugging Face copy holds `main/` and `socratic/`: the same problems, counted once
        return super().load(path / "main" if (path / "main").is_dir() else path)

    def gold(self, row: dict[str, Any]) -> str | None:
        answer = row.get("answer")
        if not isinstance(answer, str) or "####" not in answer:
            return None
        final = answer.rsplit("####", 1)[1].strip().replace(",", "")
        return final or None

    def missing_answer(self) -> str:
        return "`answer` does not end in '#### <number>'"


@BENCHMARKS.register("math", origin=_ORIGIN)
class MathHendrycks(MathSuite):
    """MATH competition problems (accuracy); MATH-500 subsets read the same way."""

    name = "math"
    metric = "accuracy (MATH is_equiv on the last box), greedy and pass@k"
    layout = "JSONL/Parquet rows or the release's test/<subject>/<n>.json: problem, solution with \\boxed{}"
    graders = {"math-is-equiv": "hendrycks_math_answer", MATH_VERIFY: "math_equivalent"}
    question_fields: tuple[str, ...] = ("problem",)
    group_field: str | None = "level"

    def gold(self, row: dict[str, Any]) -> str | None:
        direct = super().gold(row)
        if direct is not None:
            return direct
        solution = row.get("solution")
        return extract_answer(solution) if isinstance(solution, str) else None

    def missing_answer(self) -> str:
        return "no `answer` field and no \\boxed{} in `solution`"


@BENCHMARKS.register("minervamath", origin=_ORIGIN)
class Minerva(MathHendrycks):
    """MinervaMath (OCWCourses) science problems (accuracy)."""

    name = "minervamath"
    metric = "accuracy (Minerva normalisation), greedy and pass@k"
    layout = "JSONL/Parquet rows: question, answer (or solution with \\boxed{})"
    graders = {"minerva": "minerva_answer", MATH_VERIFY: "math_equivalent"}
    question_fields = ("question", "problem")
    group_field = None


@BENCHMARKS.register("aime2024", origin=_ORIGIN)
class Aime2024(MathSuite):
    """AIME 2024 (30 problems, integer answers; accuracy, usually best-of-k)."""

    name = "aime2024"
    metric = "accuracy (AIME integer), greedy and pass@k"
    layout = "Parquet/JSONL rows: problem|Problem, answer|Answer, id|ID"
    graders = {"aime-integer": "aime_answer", MATH_VERIFY: "math_equivalent"}
    question_fields = ("problem", "Problem")
