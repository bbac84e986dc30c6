"""KernelBench's check of one candidate, run inside the sandbox as a script:
`python3 - REFERENCE.py CANDIDATE.py [--precision fp32|fp16|bf16] < kernelbench_harness.py`.

Correctness first, as KernelBench's current `eval.py`: the reference `Model` and the candidate
`ModelNew`, built from the same `get_init_inputs()` under seed 42 and cast to the precision, must
agree (same shape, `torch.allclose` with atol = rtol = the precision's tolerance: fp32 1e-4, fp16
and bf16 1e-2) on 5 `get_inputs()` draws, each under its own seed drawn from seed 42; every tensor
input is cast to the precision. Then speed: the median wall time of each over `--runs` calls
(CUDA synchronised when a GPU is there). The last stdout line is one JSON object:
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
SEED = 42
TOLERANCES = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}
"""KernelBench's `get_tolerance_for_precision` (its `eval.py`; v0.1 used 1e-2 for fp32)."""


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dtype(precision: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def _cast(value: Any, device: str, dtype: Any) -> Any:
    import torch

    return value.to(dtype=dtype).to(device) if isinstance(value, torch.Tensor) else value


def _trial_seeds() -> list[int]:
    import torch

    torch.manual_seed(SEED)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(CORRECTNESS_TRIALS)]


def _inputs(reference: ModuleType, seed: int, device: str, dtype: Any) -> list[Any]:
    import torch

    torch.manual_seed(seed)
    return [_cast(x, device, dtype) for x in reference.get_inputs()]


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


def _build(cls: Any, init: list[Any], device: str, dtype: Any) -> Any:
    import torch

    torch.manual_seed(SEED)
    return cls(*init).to(device=device, dtype=dtype).eval()


def _agrees(model: Any, candidate: Any, inputs: list[Any], tolerance: float, trial: int) -> bool:
    import torch

    try:
        with torch.no_grad():
            want, got = model(*inputs), candidate(*inputs)
        if want.shape != got.shape:
            print(f"output shape {tuple(got.shape)} differs from {tuple(want.shape)} on trial {trial}",
                  file=sys.stderr)
            return False
        if torch.allclose(got, want, atol=tolerance, rtol=tolerance):
            return True
    except Exception as exc:  # the model's code
        print(f"candidate raised on trial {trial}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    print(f"candidate output differs from the reference on trial {trial}", file=sys.stderr)
    return False


def check(reference_path: str, candidate_path: str, *, runs: int = 20,
          precision: str = "fp32") -> dict[str, float]:
    """The candidate's components; any failure of the candidate is reported, never raised."""
    import torch

    result = {"compiled": 0.0, "correct": 0.0, "speedup": 0.0}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = _dtype(precision)
    reference = _load(reference_path, "reference")
    init = [_cast(x, device, dtype) for x in reference.get_init_inputs()]
    model = _build(reference.Model, init, device, dtype)
    try:
        candidate = _build(_load(candidate_path, "candidate").ModelNew, init, device, dtype)
    except Exception as exc:  # the model's code: any failure means it did not compile
        print(f"candidate does not build: {type(exc).__name__}: {exc}", file=sys.stderr)
        return result
    result["compiled"] = 1.0
    tolerance = TOLERANCES[precision]
    for trial, seed in enumerate(_trial_seeds()):
        if not _agrees(model, candidate, _inputs(reference, seed, device, dtype), tolerance, trial):
            return result
    result["correct"] = 1.0
    inputs = _inputs(reference, SEED, device, dtype)
    result["speedup"] = _median_s(model, inputs, runs, device) / _median_s(candidate, inputs, runs, device)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="KernelBench: correctness, then speedup")
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--precision", choices=sorted(TOLERANCES), default="fp32")
    args = parser.parse_args(argv)
    print(json.dumps(check(args.reference, args.candidate, runs=args.runs, precision=args.precision)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
