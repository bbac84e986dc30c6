"""The math suites: GSM8K, MATH, MinervaMath and AIME 2024 as their authors publish them, scored
by accuracy with math-verify's answer equivalence (`reward: math_equivalent`), greedy (one
sample per task) and best-of-k (pass@k, the unbiased estimator).

Published layouts (JSON Lines, a JSON array or Parquet; a folder: its `test*` files):
- GSM8K: `question`, `answer` ending in `#### <number>`;
- MATH: `problem`, `solution` with the answer in the last `\\boxed{}` (or an `answer` field);
- MinervaMath: `question` (or `problem`), `answer` (or `solution` with `\\boxed{}`);
- AIME 2024: `problem`/`Problem`, `answer`/`Answer`, `id`/`ID`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacx.infra.benchmarks.protocols import LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS
from stacx.infra.benchmarks.rows import data_files, read_rows
from stacx.infra.benchmarks.scoring import rate_score
from stacx.rollout.scaffolds import extract_answer
from stacx.schemas.records import TaskSample

__all__ = ["Aime2024", "Gsm8k", "MathSuite", "Minerva", "MathHendrycks"]

INSTRUCTION = "Solve the problem. Put your final answer within \\boxed{}."
_ID_FIELDS = ("id", "ID", "unique_id", "idx")
_ORIGIN = "builtin (stacx.infra.benchmarks.math_suites)"


class MathSuite:
    """A question/answer suite; subclasses say which fields hold the question and the answer."""

    name = "math-suite"
    metric = "accuracy (math-verify), greedy and pass@k"
    layout = "JSONL / JSON / Parquet rows"
    scaffold = "single_turn"
    reward = "math_equivalent"
    question_fields: tuple[str, ...] = ("question", "problem")

    def __init__(self) -> None:
        self.task_type: str = self.name

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
            for index, (where, row) in enumerate(read_rows(file)):
                task = self._task(row, where, index, file) if isinstance(row, dict) else row
                if isinstance(task, TaskSample):
                    tasks.append(task)
                else:
                    problems.append(f"{where}: {task}")
        return LoadedSuite(tasks, problems)

    def fix(self) -> str:
        return f"point --from at the {self.name} file ({self.layout})"

    def _task(self, row: dict[str, Any], where: str, index: int, file: Path) -> TaskSample | str:
        question = _first(row, self.question_fields)
        if not isinstance(question, str) or not question.strip():
            return f"no {' or '.join(f'`{f}`' for f in self.question_fields)} text; skipped"
        gold = self.gold(row)
        if gold is None:
            return f"{self.missing_answer()}; skipped"
        row_id = _first(row, _ID_FIELDS)
        task_id = f"{self.name}/{row_id if row_id is not None else f'{file.stem}-{index}'}"
        return TaskSample(
            task_id=task_id,
            task_type=self.task_type,
            prompt=f"{question.strip()}\n\n{INSTRUCTION}",
            data=json.dumps({"answer": gold}),
            metadata={"suite": self.name, "source": where},
        )

    def prepare(self, path: Path) -> list[str]:
        return self.load(path).readiness(f"{path}: holds no rows; {self.fix()}")

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        return rate_score(outcomes, metric="accuracy", k=k)


def _first(row: dict[str, Any], fields: Sequence[str]) -> Any:
    return next((row[f] for f in fields if row.get(f) is not None), None)


@BENCHMARKS.register("gsm8k", origin=_ORIGIN)
class Gsm8k(MathSuite):
    """GSM8K grade-school word problems (accuracy)."""

    name = "gsm8k"
    layout = "JSONL/Parquet rows: question, answer ending '#### N'"
    question_fields = ("question",)

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
    layout = "JSONL/Parquet rows: problem, solution with \\boxed{} (or answer)"
    question_fields: tuple[str, ...] = ("problem",)

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
    layout = "JSONL/Parquet rows: question, answer (or solution with \\boxed{})"
    question_fields = ("question", "problem")


@BENCHMARKS.register("aime2024", origin=_ORIGIN)
class Aime2024(MathSuite):
    """AIME 2024 (30 problems, integer answers; accuracy, usually best-of-k)."""

    name = "aime2024"
    layout = "Parquet/JSONL rows: problem|Problem, answer|Answer, id|ID"
    question_fields = ("problem", "Problem")
