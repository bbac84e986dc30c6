"""Where the quickstart pipeline's memory goes: peak PSS per service and which processes load torch.

    .venv/bin/python bench/pipeline_memory.py --json                 # 90 s of GRPO
    .venv/bin/python bench/pipeline_memory.py --budget-s 60 --json

Runs the STACX side of bench/peer_trl.py exactly as that benchmark does (the quickstart's real
services from the shared SFT checkpoint, process sandbox, free ports, a wall-clock stop); its PSS
sampler, which looks once a second at every process of every service, also records each process's
peak PSS and whether it maps libtorch (a process that imported torch maps `libtorch_cpu`). Last
line (JSON): the peak summed PSS, the peak PSS per service, per service the processes that loaded
torch, and the trajectories/s and policy versions of the run (so a memory change can be checked
for lost speed).
`limit_pss_mib` is `--trl-peak-mib` (TRL's peak PSS on this task, from bench/peer_trl.py) × 1.5,
the goal the pipeline is held to; `ok` says whether the peak summed PSS is under it.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:  # run as a script: the packages, not bench/'s namesakes
    sys.path[0] = str(_HERE.parent)

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

from stacx.infra.paths import stacx_home  # noqa: E402
from stacx.infra.pipeline.config import load_spec  # noqa: E402


def _load_peer_trl() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peer_trl", _HERE / "peer_trl.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peer_trl"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=90.0, help="wall-clock GRPO budget")
    parser.add_argument(
        "--trl-peak-mib",
        type=float,
        default=1700.0,
        help="TRL's peak PSS on the task (bench/peer_trl.py's trl peak_pss_mib)",
    )
    parser.add_argument("--config", default=str(_HERE.parent / "examples" / "quickstart.yaml"))
    parser.add_argument("--out", default=str(_HERE.parent / "runs" / "pipeline-memory"))
    parser.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    args = parser.parse_args(argv)

    peer_trl = _load_peer_trl()
    base = load_spec(args.config)
    options = ["--budget-s", str(args.budget_s), "--config", args.config, "--out", args.out]
    cfg = peer_trl.bench_config(base, peer_trl.build_parser().parse_args(options))
    cfg.out.mkdir(parents=True, exist_ok=True)
    # the same cache as peer_trl.py
    sft_dir = peer_trl.build_sft(base, stacx_home() / "peer-trl", config=args.config)
    name = f"memory-stacx-{os.getpid()}"
    pipeline = peer_trl.BudgetPipeline(
        peer_trl.stacx_spec(base, cfg, name=name, python="python3"), sft_dir=sft_dir, budget_s=cfg.budget_s
    )
    try:
        pipeline.run()
    finally:
        peer_trl.delete_own_run(base.bootstrap_servers, pipeline.layout.run_id)
    processes = pipeline.memory.process_summary()
    limit = 1.5 * args.trl_peak_mib
    peak = pipeline.memory.peak_pss_bytes / 2**20
    result = {
        "benchmark": "pipeline_memory",
        "budget_s": args.budget_s,
        "peak_pss_mib": round(peak, 1),
        "peak_rss_mib": round(pipeline.memory.peak_bytes / 2**20, 1),
        "peak_pss_mib_by_service": {
            n: round(b / 2**20, 1) for n, b in sorted(pipeline.memory.peak_pss_by_name.items())
        },
        "torch_processes": pipeline.memory.torch_processes(),
        "processes": processes,
        "trajectories_per_s": round(pipeline.trajectories_at_budget / args.budget_s, 3),
        "policy_versions": len(pipeline.metrics.version_times),
        "limit_pss_mib": round(limit, 1),
        "ok": peak <= limit,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
