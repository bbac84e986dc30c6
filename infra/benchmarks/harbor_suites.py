"""Terminal-Bench 2.0 and SETA: Harbor task folders (`task.toml`, `instruction.md`,
`environment/`, `tests/test.sh`), run with the terminal agent; each task's own tests score it
(`reward: verifier`), run after the agent ends or hits the task's own agent timeout, as Harbor
runs a trial. The suite reports Harbor's metric, the mean reward (partial rewards kept), with the
success rate (reward 1) beside it, overall and per `[metadata] difficulty`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from stacx.infra.benchmarks.protocols import LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS
from stacx.infra.benchmarks.scoring import mean_reward_score
from stacx.schemas.records import TaskSample

__all__ = ["HarborSuite", "Seta", "TerminalBench2"]

_ORIGIN = "builtin (stacx.infra.benchmarks.harbor_suites)"


class HarborSuite:
    """A dataset of Harbor task folders; a task passes when its verifier writes reward 1."""

    name = "harbor"
    metric = "mean reward (Harbor's Mean), success rate; per difficulty"
    layout = "Harbor task folders (task.toml, instruction.md, environment/, tests/)"
    scaffold = "terminal"
    reward = "verifier"

    def __init__(self) -> None:
        self.task_type: str = self.name

    def load(self, path: Path) -> LoadedSuite:
        from stacx.sandbox.errors import SandboxError
        from stacx.sandbox.tasks import find_task_dirs, load_task, to_task_sample

        if not path.is_dir():
            return LoadedSuite([], [f"{path}: not a folder; point --from at the {self.name} task folders"])
        tasks: list[TaskSample] = []
        problems: list[str] = []
        for task_dir in find_task_dirs(path):
            try:
                task = load_task(task_dir)
            except SandboxError as exc:
                problems.append(f"{task_dir}: {exc}; skipped")
                continue
            if task.unsupported:
                problems.append(f"{task_dir}: {task.unsupported}; skipped")
                continue
            sample = to_task_sample(task)
            metadata = {**sample.metadata, "suite": self.name}
            difficulty = task.metadata.get("difficulty")
            if isinstance(difficulty, str) and difficulty.strip():
                metadata["group"] = difficulty.strip()
            tasks.append(dataclasses.replace(sample, task_type=self.task_type, metadata=metadata))
        return LoadedSuite(tasks, problems)

    def prepare(self, path: Path) -> list[str]:
        return self.load(path).readiness(
            f"{path}: no task folder (a folder with task.toml) under it; point --from at the "
            f"{self.name} dataset folder")

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        return mean_reward_score(outcomes, k=k)


@BENCHMARKS.register("terminal-bench-2", origin=_ORIGIN)
class TerminalBench2(HarborSuite):
    """Terminal-Bench 2.0: terminal tasks in Harbor format (success rate)."""

    name = "terminal-bench-2"


@BENCHMARKS.register("seta", origin=_ORIGIN)
class Seta(HarborSuite):
    """SETA: terminal-agent tasks in Harbor format (success rate)."""

    name = "seta"
