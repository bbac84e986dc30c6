"""`stacx quickstart [--name NAME] [--steps N]`, `stacx run CONFIG.yaml [--explain]` and
`stacx init [PATH]`.

`run` trains the model of the config on its tasks through the whole loop (GRPO through Kafka,
Faust, Docker sandboxes, FSDP2 training and weight hot-swaps) and writes `runs/<name>/report.json`
plus a reward-curve PNG; `quickstart` is `run examples/quickstart.yaml`. The config is validated
whole before anything starts: each problem is one line, exit status 2. `--explain` prints the
resolved config of every service and starts nothing. Services must be up first: `stacx infra up`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

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
    run.add_argument(
        "--explain", action="store_true", help="print the resolved config of every service; start nothing"
    )
    run.add_argument("--ray", metavar="ADDRESS", help="place the services on the Ray cluster at ADDRESS "
                     "(HOST:PORT of its head; the file's `placement:` section says what each asks for)")
    _common(run)
    run.set_defaults(func=_run)

    init = subparsers.add_parser(
        "init", help="write a commented starter pipeline config (own model, own tasks)"
    )
    init.add_argument("path", nargs="?", type=Path, default=Path("stacx.yaml"), help="file to write")
    init.add_argument("--force", action="store_true", help="overwrite an existing file")
    init.set_defaults(func=_init)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", help="override pipeline.runs_dir")
    parser.add_argument("--timeout", type=float, help="override pipeline.timeout_s (seconds)")
    parser.add_argument("--no-live", action="store_true", help="log lines instead of the live view")


def _quickstart(args: argparse.Namespace) -> int:
    return _execute(QUICKSTART_CONFIG, args)


def _run(args: argparse.Namespace) -> int:
    return _execute(args.config, args)


def _init(args: argparse.Namespace) -> int:
    from stacx.infra.pipeline.starter import STARTER_CONFIG

    path: Path = args.path
    if path.exists() and not args.force:
        print(f"stacx init: {path} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(STARTER_CONFIG)
    except OSError as exc:
        print(f"stacx init: cannot write {path} ({exc})", file=sys.stderr)
        return 2
    print(f"wrote {path}: set pipeline.model and pipeline.tasks, then `stacx run {path} --explain`")
    return 0


def _apply(spec: Any, args: argparse.Namespace) -> None:
    """Command-line overrides of the `pipeline` section, validated like the file's values."""
    import pydantic

    from stacx.infra.pipeline import PipelineConfigError

    overrides = {"name": args.name, "steps": args.steps, "runs_dir": args.runs_dir, "timeout_s": args.timeout}
    if args.no_live:
        overrides["live"] = False
    for key, value in overrides.items():
        if value is None:
            continue
        try:
            setattr(spec.pipeline, key, value)
        except pydantic.ValidationError as exc:
            problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise PipelineConfigError(f"pipeline.{key}={value!r} (command line): {problem}") from exc
    if getattr(args, "ray", None):
        _place_on_ray(spec, args.ray)
    if args.steps is not None:  # the trainer's max_steps follows pipeline.steps
        from stacx.infra.pipeline.resolve import check_sections

        check_sections(spec)


def _place_on_ray(spec: Any, address: str) -> None:
    """`--ray ADDRESS`: the file's `placement:` section (if any) at that address."""
    import pydantic

    from stacx.infra.pipeline import PipelineConfigError
    from stacx.infra.pipeline.raycluster import RayPlacementConfig

    written = spec.placement.model_dump() if spec.placement is not None else {}
    try:
        spec.placement = RayPlacementConfig.model_validate({**written, "address": address})
    except pydantic.ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise PipelineConfigError(f"--ray {address}: {problem}") from exc


def _say_errors(command: str, exc: BaseException) -> None:
    for line in str(exc).splitlines():
        print(f"stacx {command}: {line}", file=sys.stderr)


def _execute(config_path: Path, args: argparse.Namespace) -> int:
    from stacx.infra.pipeline import (
        MissingComponentError,
        PipelineConfigError,
        PipelineError,
        load_spec,
        run_pipeline,
    )
    from stacx.infra.pipeline.layout import RunLayout
    from stacx.infra.pipeline.resolve import check_resolved, explain

    spec = None
    try:
        spec = load_spec(config_path)
        _apply(spec, args)
        if len(spec.cluster.hosts) > 1:
            hosts = ", ".join(h.name for h in spec.cluster.hosts)
            raise PipelineConfigError(
                f"{config_path}: cluster: {len(spec.cluster.hosts)} hosts ({hosts}); start each with "
                f"`stacx node up --cluster {config_path} --host NAME` (stacx run is the one-host case)"
            )
        check_resolved(spec)  # the same checks with and without --explain, before anything starts
        if getattr(args, "explain", False):
            print(explain(spec, RunLayout.create(spec)), end="")
            return 0
        # the run's progress is its live view: no download/loading bars from its services
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        report = run_pipeline(spec)
    except PipelineConfigError as exc:
        _say_errors(args.command, exc)
        return 2
    except MissingComponentError as exc:
        print(f"stacx {args.command}: {exc}", file=sys.stderr)
        return 2
    except PipelineError as exc:
        print(f"stacx {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a bug in a service library: full traceback, then where to look
        log.error("pipeline failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        where = RunLayout.create(spec).root if spec is not None else "the run directory"
        print(
            f"stacx {args.command}: the pipeline failed ({type(exc).__name__}: {exc}); the partial "
            f"report and the service logs are under {where}/",
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
    for version, trace_id in (report.get("traces_by_version") or {}).items():
        print(f"trace of an episode of v{version}: stacx trace {trace_id}")
    print(view_hint(report))


def view_hint(report: dict[str, Any]) -> str:
    """The `stacx view` command that shows this run, and the page of the run."""
    from stacx.infra.commands.view import DEFAULT_PORT

    runs_dir = Path(report["curve_png"]).parent.parent
    url = f"http://127.0.0.1:{DEFAULT_PORT}/runs/{quote(str(report['run_id']), safe='')}"
    command = f"stacx view --runs-dir {shlex.quote(str(runs_dir))}"
    return f"curves and trajectories: {command}  (then open {url})"
