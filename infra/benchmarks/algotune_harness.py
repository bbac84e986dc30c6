"""An AlgoTune task's check of one solver, run inside the sandbox as a script:
`python3 - TASK.py SOLVER.py < algotune_harness.py` (the AlgoTune checkout on PYTHONPATH when the
task file imports `AlgoTuneTasks.base`).

The task class (the one defining `generate_problem`, `solve` and `is_solution`) makes
`--problems` problems of size `--size` with seeds 0, 1, ...; the agent's `Solver().solve` must
pass `is_solution` on every one (`valid`), and `speedup` is the reference's median time over the
solver's, per problem, averaged. The last stdout line is one JSON object
`{"valid": 0|1, "speedup": x}`; what went wrong goes to stderr. Standard library only. This is
STACX's timing, not AlgoTune's own harness (its sizes and time budget differ).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

_METHODS = ("generate_problem", "solve", "is_solution")


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _task_class(module: ModuleType) -> type:
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == module.__name__ and all(callable(getattr(cls, m, None)) for m in _METHODS):
            return cls
    raise LookupError(f"{module.__file__} defines no class with {', '.join(_METHODS)}")


def _median_s(solve: Callable[[Any], Any], problem: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        solve(problem)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check(task_path: str, solver_path: str, *, size: int = 64, problems: int = 5,
          runs: int = 5) -> dict[str, float]:
    """The solver's components; any failure of the solver is reported, never raised."""
    task = _task_class(_load(task_path, "algotune_task"))()
    result = {"valid": 0.0, "speedup": 0.0}
    try:
        solver = _load(solver_path, "solver").Solver()
    except Exception as exc:  # the model's code
        print(f"solver does not build: {type(exc).__name__}: {exc}", file=sys.stderr)
        return result
    ratios = []
    for seed in range(problems):
        problem = task.generate_problem(size, random_seed=seed)
        try:
            valid = bool(task.is_solution(problem, solver.solve(problem)))
        except Exception as exc:
            print(f"solver raised on problem {seed}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return result
        if not valid:
            print(f"solver's answer to problem {seed} fails is_solution", file=sys.stderr)
            return result
        reference_s = _median_s(task.solve, problem, runs)
        ratios.append(reference_s / max(_median_s(solver.solve, problem, runs), 1e-9))
    return {"valid": 1.0, "speedup": statistics.fmean(ratios)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="AlgoTune: validity, then speedup")
    parser.add_argument("task")
    parser.add_argument("solver")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--problems", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(check(args.task, args.solver, size=args.size, problems=args.problems, runs=args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
