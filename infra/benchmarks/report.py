"""A benchmark run's results: the per-task table, the JSON file (every sample's reward
components, so the metric can be recomputed by hand or by `stacx bench score`), and the
comparison with a previous result file."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stacx.infra.benchmarks.protocols import BenchmarkSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.rows import natural_key

__all__ = [
    "ResultFileError",
    "compare_lines",
    "denominator",
    "group_scores",
    "group_table",
    "read_results",
    "result_document",
    "score_table",
]

FORMAT = "stacx-bench/1"


class ResultFileError(ValueError):
    """A result file cannot be read; the message is one line naming the file and the fix."""


def group_scores(suite: BenchmarkSuite, outcomes: Sequence[TaskOutcome], *, k: int) -> dict[str, SuiteScore]:
    """The suite's metric per level or difficulty (`TaskOutcome.group`), as the suite reports
    it; empty when no task has a group."""
    names = sorted({o.group for o in outcomes if o.group}, key=natural_key)
    return {name: suite.score([o for o in outcomes if o.group == name], k=k) for name in names}


def denominator(outcomes: Sequence[TaskOutcome]) -> dict[str, int]:
    """How many tasks the figure is over, and how many of them never ran (skipped by the suite,
    cut by --limit, or every sample lost): those count as failures."""
    not_run = sum(1 for o in outcomes if o.samples and all(s.get("not_run") for s in o.samples))
    return {"denominator": len(outcomes), "tasks not run (failures)": not_run}


def result_document(suite: str, score: SuiteScore, outcomes: list[TaskOutcome], *, k: int,
                    run: Mapping[str, Any] | None = None,
                    groups: Mapping[str, SuiteScore] | None = None) -> dict[str, Any]:
    """The JSON a run writes: the suite metric with its interval, its denominator, the figures
    per level or difficulty, and per task its values, group and samples."""
    samples = {o.task_id: o.samples for o in outcomes}
    task_groups = {o.task_id: o.group for o in outcomes if o.group}
    return {
        "format": FORMAT,
        "suite": suite,
        "metric": score.metric,
        "value": score.value,
        "interval": list(score.interval),
        "interval_method": score.interval_method,
        "k": k,
        "extra": score.extra,
        "denominator": denominator(outcomes),
        "groups": {name: {"metric": g.metric, "value": g.value, "interval": list(g.interval), **g.extra}
                   for name, g in (groups or {}).items()},
        "tasks": {task_id: {**values, **({"group": task_groups[task_id]} if task_id in task_groups else {}),
                            "sample_rewards": samples.get(task_id, [])}
                  for task_id, values in sorted(score.per_task.items())},
        "run": dict(run or {}),
    }


def read_results(path: Path) -> dict[str, Any]:
    """A result file written by `stacx bench run` (or in its shape); `ResultFileError` otherwise."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        message = f"{path}: no such file; pass a result file `stacx bench run --json` wrote"
        raise ResultFileError(message) from exc
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), dict) or "suite" not in doc:
        raise ResultFileError(f"{path}: not a benchmark result file (it needs `suite` and `tasks`; "
                              "`stacx bench run --json` writes one)")
    return doc


def outcomes_of(doc: Mapping[str, Any], *, where: str) -> list[TaskOutcome]:
    """Every task's samples in a result document; `ResultFileError` on a malformed task."""
    outcomes = []
    for task_id, row in doc["tasks"].items():
        samples = row.get("sample_rewards") if isinstance(row, dict) else None
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise ResultFileError(f"{where}: tasks.{task_id}.sample_rewards: not a list of "
                                  "{component: number} objects")
        group = row.get("group", "") if isinstance(row.get("group", ""), str) else ""
        values = [{str(k): float(v) for k, v in s.items()} for s in samples]
        outcomes.append(TaskOutcome(task_id, values, group))
    return outcomes


def score_table(suite: str, score: SuiteScore) -> Any:
    """A rich table: one row per task with the values the metric is computed from."""
    from rich.table import Table

    columns = sorted({c for row in score.per_task.values() for c in row})
    table = Table(title=f"{suite}: {score.metric} {score.value:.4f} "
                        f"(95% {score.interval_method} [{score.interval[0]:.4f}, {score.interval[1]:.4f}])")
    table.add_column("task")
    for column in columns:
        table.add_column(column, justify="right")
    for task_id, row in sorted(score.per_task.items()):
        table.add_row(task_id, *(_cell(row.get(c)) for c in columns))
    return table


def group_table(suite: str, groups: Mapping[str, SuiteScore]) -> Any:
    """A rich table: the suite's metric per level or difficulty, with its short figures
    (`fast_1`, `pass@4`, ...; every figure is in the JSON)."""
    from rich.table import Table

    first = next(iter(groups.values()))
    columns = sorted({c for g in groups.values() for c in g.extra if " " not in c})
    table = Table(title=f"{suite}: {first.metric} per level / difficulty")
    for column in ("group", "value", "95% interval", *columns):
        table.add_column(column, justify="left" if column == "group" else "right")
    for name, g in groups.items():
        interval = f"[{g.interval[0]:.3f}, {g.interval[1]:.3f}]"
        table.add_row(name, f"{g.value:.4f}", interval, *(_cell(g.extra.get(c)) for c in columns))
    return table


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def compare_lines(new: Mapping[str, Any], old: Mapping[str, Any], *, old_path: Path) -> list[str]:
    """The change from `old` to `new`: the metric, then each task whose values changed."""
    if old.get("suite") != new["suite"]:
        raise ResultFileError(f"{old_path}: holds suite {old.get('suite')!r}, not {new['suite']!r}; "
                              "compare results of the same suite")
    lines = [f"{new['metric']}: {_num(old.get('value'))} -> {_num(new['value'])} "
             f"({_delta(new['value'], old.get('value'))})"]
    old_tasks: Mapping[str, Any] = old["tasks"]
    for task_id, row in sorted(new["tasks"].items()):
        before = old_tasks.get(task_id)
        if before is None:
            lines.append(f"  {task_id}: new task")
            continue
        changed = [f"{key} {_num(before.get(key))} -> {_num(value)}" for key, value in sorted(row.items())
                   if key not in ("sample_rewards", "samples") and before.get(key) != value]
        if changed:
            lines.append(f"  {task_id}: {', '.join(changed)}")
    lines += [f"  {task_id}: not in this run" for task_id in sorted(set(old_tasks) - set(new["tasks"]))]
    return lines


def _num(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def _delta(new: Any, old: Any) -> str:
    if not isinstance(old, (int, float)):
        return "no previous value"
    return f"{new - old:+.4f}"
