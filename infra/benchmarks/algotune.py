"""AlgoTune: a checkout of the suite (`AlgoTuneTasks/<task>/description.txt` and
`AlgoTuneTasks/<task>/<task>.py`, the reference solver with `generate_problem`, `solve`,
`is_solution`). The agent writes a faster `Solver.solve`.

Each episode's reward components are `valid` (0/1: every test problem's solution passed
`is_solution`) and `speedup` (reference time / solver time). The suite's rule (Press et al.,
AlgoTune, arXiv:2507.15887; algotune.io): a task's speedup is the solver's when it is valid and
faster, else 1.0 (the baseline: an invalid or slower solver scores as the reference), and the
AlgoTune score is the harmonic mean of the per-task speedups (bootstrap interval). With n samples
and best-of-k, a task's speedup is the expected best of k drawn from all n (never the first k to
finish), its validity pass@k.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from stacx.infra.benchmarks.protocols import LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS
from stacx.infra.benchmarks.stats import bootstrap_interval, expected_best_of_k, harmonic_mean, pass_at_k
from stacx.rollout.protocols import EnvironmentSession
from stacx.rollout.rewards import VERIFIERS
from stacx.schemas.records import TaskSample

__all__ = ["AlgoTune", "algotune_verifier", "task_speedup", "task_valid"]

SOLVER = "/workspace/solver.py"
TASK_FILE = "/tmp/algotune_task.py"
HARNESS = Path(__file__).with_name("algotune_harness.py")
"""The check run in the sandbox (python3 and the task's own imports in the task image)."""

BASELINE = 1.0
"""AlgoTune's score for an invalid or slower solver: the reference's own speed."""
PROMPT = (
    "Make this task's solver faster. Write /workspace/solver.py with `class Solver` whose `solve(problem)` "
    "returns what the reference returns (it must pass `is_solution`).\n\n"
)


@VERIFIERS.register("algotune", origin="builtin (stacx.infra.benchmarks.algotune)")
async def algotune_verifier(session: EnvironmentSession, task: TaskSample) -> dict[str, float]:
    """Validity, then speedup, of the agent's /workspace/solver.py against the task's reference."""
    await session.exec(f"cat > {TASK_FILE}", stdin=json.loads(task.data)["reference"], timeout_s=60)
    result = await session.exec(f"python3 - {TASK_FILE} {SOLVER}", stdin=HARNESS.read_text(),
                                timeout_s=1800)
    lines = result.stdout.strip().splitlines()
    try:
        components = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        components = {}
    if not isinstance(components, dict):  # the harness itself failed (the task's imports, ...)
        components = {}
    valid = float(components.get("valid", 0.0))
    speedup = float(components.get("speedup", 0.0))
    # the episode's reward is the valid solver's speedup (invalid: 0); the suite's metric applies
    # AlgoTune's rule (invalid or slower counts 1.0) to `valid` and `speedup`
    return {"reward": speedup if valid else 0.0, "valid": valid, "speedup": speedup}


def task_speedup(samples: Sequence[dict[str, float]], k: int) -> float:
    """The expected best of `k` samples drawn from all of them, each under AlgoTune's rule
    (invalid or slower: 1.0); missing samples, up to k, count 1.0."""
    k = max(1, k)
    values = [max(BASELINE, s.get("speedup", 0.0)) if s.get("valid", 0.0) >= 1.0 else BASELINE
              for s in samples]
    values += [BASELINE] * (k - len(values))
    return expected_best_of_k(values, k)


def task_valid(samples: Sequence[dict[str, float]], k: int) -> float:
    """pass@k of validity over all the task's samples (missing ones, up to k, invalid)."""
    k = max(1, k)
    valid = sum(1 for s in samples if s.get("valid", 0.0) >= 1.0)
    return pass_at_k(max(len(samples), k), valid, k)


@BENCHMARKS.register("algotune", origin="builtin (stacx.infra.benchmarks.algotune)")
class AlgoTune:
    """AlgoTune numerical-program speedups: the AlgoTune score (harmonic-mean speedup)."""

    name = "algotune"
    metric = "AlgoTune score: harmonic-mean speedup (invalid or slower = 1.0)"
    layout = "git checkout: AlgoTuneTasks/<task>/{description.txt,<task>.py}"
    task_type = "algotune"
    scaffold = "terminal"
    reward = "verifier"
    verifier = "algotune"

    def load(self, path: Path) -> LoadedSuite:
        root = path / "AlgoTuneTasks" if (path / "AlgoTuneTasks").is_dir() else path
        if not root.is_dir():
            line = f"{path}: no AlgoTuneTasks folder; point --from at a checkout of AlgoTune"
            return LoadedSuite([], [line])
        tasks: list[TaskSample] = []
        problems: list[str] = []
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
            description, solver = folder / "description.txt", folder / f"{folder.name}.py"
            missing = [p.name for p in (description, solver) if not p.is_file()]
            if missing:
                problems.append(f"{folder}: missing {', '.join(missing)}; an AlgoTune task has "
                                f"description.txt and {folder.name}.py; skipped")
                continue
            reference = solver.read_text(encoding="utf-8", errors="replace")
            text = description.read_text(encoding="utf-8", errors="replace")
            tasks.append(TaskSample(
                task_id=folder.name,
                task_type=self.task_type,
                prompt=f"{PROMPT}{text}\n\nReference implementation:\n{reference}",
                data=json.dumps({"reference": reference}),
                metadata={"suite": self.name},
            ))
        return LoadedSuite(tasks, problems)

    def prepare(self, path: Path) -> list[str]:
        return self.load(path).readiness(f"{path}: AlgoTuneTasks holds no task folders")

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        per_task = {}
        for o in outcomes:
            per_task[o.task_id] = {"samples": float(len(o.samples)), "valid": task_valid(o.samples, k),
                                   "speedup": task_speedup(o.samples, k)}
        speedups = [row["speedup"] for row in per_task.values()]
        valid = sum(row["valid"] for row in per_task.values())
        extra = {"tasks": float(len(per_task)), "valid rate": valid / len(per_task) if per_task else 0.0}
        return SuiteScore(metric="AlgoTune score", value=harmonic_mean(speedups),
                          interval=bootstrap_interval(speedups, harmonic_mean),
                          interval_method="bootstrap", extra=extra, per_task=per_task)
