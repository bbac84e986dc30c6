"""KernelBench's check of one candidate, run inside the sandbox as a script:
`python3 - REFERENCE.py CANDIDATE.py < kernelbench_harness.py`.

Correctness first: the reference `Model` and the candidate `ModelNew`, built from the same
`get_init_inputs()` under the same seed, must agree on 5 random `get_inputs()` draws within
atol = rtol = 1e-2 (KernelBench's tolerance). Then speed: the median wall time of each over
`--runs` calls (CUDA synchronised when a GPU is there). The last stdout line is one JSON object:
`{"compiled": 0|1, "correct": 0|1, "speedup": reference / candidate}`; what went wrong goes to stderr.
Only the standard library and torch: this file runs in the task's image, not in STACX.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from types import ModuleType
from typing import Any

CORRECTNESS_TRIALS = 5
TOLERANCE = 1e-2


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inputs(reference: ModuleType, seed: int, device: str) -> list[Any]:
    import torch

    torch.manual_seed(seed)
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in reference.get_inputs()]


def _median_s(model: Any, inputs: list[Any], runs: int, device: str) -> float:
    import torch

    times = []
    with torch.no_grad():
        model(*inputs)  # warm-up (lazy compilation, caches)
        for _ in range(runs):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(*inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def check(reference_path: str, candidate_path: str, *, runs: int = 20) -> dict[str, float]:
    """The candidate's components; any failure of the candidate is reported, never raised."""
    import torch

    result = {"compiled": 0.0, "correct": 0.0, "speedup": 0.0}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference = _load(reference_path, "reference")
    init = reference.get_init_inputs()
    torch.manual_seed(0)
    model = reference.Model(*init).to(device).eval()
    try:
        candidate_cls = _load(candidate_path, "candidate").ModelNew
        torch.manual_seed(0)
        candidate = candidate_cls(*init).to(device).eval()
    except Exception as exc:  # the model's code: any failure means it did not compile
        print(f"candidate does not build: {type(exc).__name__}: {exc}", file=sys.stderr)
        return result
    result["compiled"] = 1.0
    for trial in range(CORRECTNESS_TRIALS):
        inputs = _inputs(reference, trial, device)
        try:
            with torch.no_grad():
                want, got = model(*inputs), candidate(*inputs)
            same = want.shape == got.shape and torch.allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)
        except Exception as exc:
            print(f"candidate raised on trial {trial}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return result
        if not same:
            print(f"candidate output differs from the reference on trial {trial}", file=sys.stderr)
            return result
    result["correct"] = 1.0
    inputs = _inputs(reference, 0, device)
    result["speedup"] = _median_s(model, inputs, runs, device) / _median_s(candidate, inputs, runs, device)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="KernelBench: correctness, then speedup")
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    print(json.dumps(check(args.reference, args.candidate, runs=args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
