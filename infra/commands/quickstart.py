"""`stacx quickstart [--name NAME] [--steps N]` and `stacx run CONFIG.yaml`.

Both run the whole loop (tiny model -> SFT -> GRPO through Kafka, Faust, Docker sandboxes,
FSDP2 training and weight hot-swaps) and write `runs/<name>/report.json` plus a reward-curve PNG.
Services must be up first: `stacx infra up` (Kafka, Docker, sandbox image).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("stacx.quickstart")

QUICKSTART_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
"""The quickstart's pipeline file (in the source checkout)."""


def register(subparsers: Any) -> None:
    quick = subparsers.add_parser(
        "quickstart",
        help="tool-integrated RL that learns: SFT, then GRPO through the full "
        "Kafka loop (examples/quickstart.yaml)",
    )
    quick.add_argument("--name", help="run name: results go to runs/NAME/ (default: quickstart)")
    quick.add_argument("--steps", type=int, help="GRPO policy versions to train")
    _common(quick)
    quick.set_defaults(func=_quickstart)

    run = subparsers.add_parser(
        "run", help="run a whole pipeline from a YAML file (e.g. examples/quickstart.yaml)"
    )
    run.add_argument("config", type=Path, help="pipeline YAML")
    run.add_argument("--name", help="override pipeline.name")
    run.add_argument("--steps", type=int, help="override pipeline.steps")
    _common(run)
    run.set_defaults(func=_run)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", help="override pipeline.runs_dir")
    parser.add_argument("--timeout", type=float, help="override pipeline.timeout_s (seconds)")
    parser.add_argument("--no-live", action="store_true", help="log lines instead of the live view")


def _quickstart(args: argparse.Namespace) -> int:
    return _execute(QUICKSTART_CONFIG, args)


def _run(args: argparse.Namespace) -> int:
    return _execute(args.config, args)


def _apply(spec: Any, args: argparse.Namespace) -> None:
    from infra.pipeline.config import PipelineConfig

    cfg = spec.pipeline
    overrides = {"name": args.name, "steps": args.steps, "runs_dir": args.runs_dir, "timeout_s": args.timeout}
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    if args.no_live:
        cfg.live = False
    PipelineConfig.__post_init__(cfg)  # re-validate the overridden values


def _execute(config_path: Path, args: argparse.Namespace) -> int:
    from infra.pipeline import PipelineError, load_spec, run_pipeline

    try:
        spec = load_spec(config_path)
        _apply(spec, args)
        report = run_pipeline(spec)
    except PipelineError as exc:
        print(f"stacx: {exc}", file=sys.stderr)
        return 2 if exc.__class__.__name__ in ("MissingComponentError", "PipelineConfigError") else 1
    except Exception as exc:  # a bug in a service library: full traceback, then where to look
        log.error("pipeline failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        print(
            f"stacx: the pipeline failed ({type(exc).__name__}: {exc}); the partial report "
            "and the service logs are under runs/<name>/",
            file=sys.stderr,
        )
        return 1
    _print_summary(report)
    return 0


def _print_summary(report: dict[str, Any]) -> None:
    keys = (
        "success_before",
        "success_after",
        "tool_rate_before",
        "tool_rate_after",
        "policy_versions",
        "wall_s",
    )
    print(json.dumps({k: report.get(k) for k in keys}))
    print(f"report: {Path(report['curve_png']).with_name('report.json')}\ncurve:  {report['curve_png']}")
