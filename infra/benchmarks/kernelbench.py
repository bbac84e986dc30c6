"""KernelBench: a checkout of the suite (`KernelBench/level1/` .. `level4/`, one PyTorch
reference per file defining `Model`, `get_inputs()` and `get_init_inputs()`). The agent writes
`ModelNew`; the suite checks correctness against the reference first, then times both.

Each episode's reward components are `correct` (0/1) and `speedup` (reference time / candidate
time). Per task the best of the first k samples counts: correct when any is, its speedup the
largest among the correct ones. The suite reports the success rate (correct, Wilson interval),
fast_1 (correct and faster than the reference) and the geometric-mean speedup of the correct
tasks (bootstrap interval).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from stacx.infra.benchmarks.protocols import LoadedSuite, SuiteScore, TaskOutcome
from stacx.infra.benchmarks.registry import BENCHMARKS
from stacx.infra.benchmarks.stats import bootstrap_interval, geometric_mean, wilson_interval
from stacx.rollout.protocols import EnvironmentSession
from stacx.rollout.rewards import VERIFIERS
from stacx.schemas.records import TaskSample

__all__ = ["KernelBench", "kernel_outcome", "kernelbench_verifier"]

_LEVEL = re.compile(r"^level\d+$")
_PARTS = ("class Model", "def get_inputs", "def get_init_inputs")
PROMPT = (
    "Write a faster version of this PyTorch model with custom GPU kernels. Define `ModelNew` with "
    "the same constructor arguments and outputs as `Model` and write it to /workspace/model_new.py.\n\n"
)


CANDIDATE = "/workspace/model_new.py"
REFERENCE = "/tmp/kernelbench_reference.py"
HARNESS = Path(__file__).with_name("kernelbench_harness.py")
"""The check run in the sandbox (the task image needs python3 and torch; a GPU for CUDA kernels)."""


@VERIFIERS.register("kernelbench", origin="builtin (stacx.infra.benchmarks.kernelbench)")
async def kernelbench_verifier(session: EnvironmentSession, task: TaskSample) -> dict[str, float]:
    """Correctness, then speedup, of the agent's /workspace/model_new.py against the task's reference."""
    reference = json.loads(task.data)["reference"]
    await session.exec(f"cat > {REFERENCE}", stdin=reference, timeout_s=60)
    result = await session.exec(f"python3 - {REFERENCE} {CANDIDATE}", stdin=HARNESS.read_text(),
                                timeout_s=1800)
    lines = result.stdout.strip().splitlines()
    try:
        components = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        components = {}
    if not isinstance(components, dict):  # the harness itself failed (no torch in the image, ...)
        components = {}
    correct = float(components.get("correct", 0.0))
    return {"reward": correct, "correct": correct, "compiled": float(components.get("compiled", 0.0)),
            "speedup": float(components.get("speedup", 0.0))}


def kernel_outcome(samples: Sequence[dict[str, float]], k: int) -> dict[str, float]:
    """A task's best of its first `k` samples: correct, speedup (0 when none is correct)."""
    chosen = list(samples[: max(1, k)])
    speedups = [s.get("speedup", 0.0) for s in chosen if s.get("correct", 0.0) >= 1.0]
    best = max(speedups, default=0.0)
    return {"samples": float(len(chosen)), "correct": float(bool(speedups)), "speedup": best,
            "fast_1": float(bool(speedups) and best > 1.0)}


@BENCHMARKS.register("kernelbench", origin="builtin (stacx.infra.benchmarks.kernelbench)")
class KernelBench:
    """KernelBench GPU-kernel tasks: success rate, fast_1 and speedup."""

    name = "kernelbench"
    metric = "success rate (correct), fast_1, geometric-mean speedup"
    layout = "git checkout: KernelBench/level*/N_Name.py (Model, get_inputs)"
    task_type = "kernelbench"
    scaffold = "terminal"
    reward = "verifier"
    verifier = "kernelbench"

    def _levels(self, path: Path) -> list[Path]:
        root = path / "KernelBench" if (path / "KernelBench").is_dir() else path
        if not root.is_dir():
            return []
        return sorted(p for p in root.iterdir() if p.is_dir() and _LEVEL.match(p.name))

    def load(self, path: Path) -> LoadedSuite:
        levels = self._levels(path)
        if not levels:
            return LoadedSuite([], [f"{path}: no KernelBench/level1 .. level4 folders; point --from "
                                    "at a checkout of the KernelBench repository"])
        tasks: list[TaskSample] = []
        problems: list[str] = []
        for level in levels:
            for file in sorted(level.glob("*.py")):
                source = file.read_text(encoding="utf-8", errors="replace")
                missing = [part for part in _PARTS if part not in source]
                if missing:
                    lacks = ", ".join(repr(m) for m in missing)
                    problems.append(f"{file}: lacks {lacks}; a KernelBench problem defines Model, "
                                    "get_inputs, get_init_inputs; skipped")
                    continue
                tasks.append(TaskSample(
                    task_id=f"{level.name}/{file.stem}",
                    task_type=self.task_type,
                    prompt=PROMPT + source,
                    data=json.dumps({"reference": source, "level": level.name}),
                    metadata={"suite": self.name, "level": level.name},
                ))
        return LoadedSuite(tasks, problems)

    def prepare(self, path: Path) -> list[str]:
        return self.load(path).readiness(f"{path}: the level folders hold no problem files (*.py)")

    def score(self, outcomes: Sequence[TaskOutcome], *, k: int) -> SuiteScore:
        per_task = {o.task_id: kernel_outcome(o.samples, k) for o in outcomes}
        n = len(per_task)
        correct = sum(row["correct"] for row in per_task.values())
        fast = sum(row["fast_1"] for row in per_task.values())
        speedups = [row["speedup"] for row in per_task.values() if row["correct"] and row["speedup"] > 0]
        low, high = bootstrap_interval(speedups, geometric_mean)
        extra = {"tasks": float(n), "fast_1": fast / n if n else 0.0,
                 "speedup (geometric mean, correct)": geometric_mean(speedups),
                 "speedup low": low, "speedup high": high}
        return SuiteScore(metric="success rate", value=correct / n if n else 0.0,
                          interval=wilson_interval(correct, n), interval_method="wilson",
                          extra=extra, per_task=per_task)
