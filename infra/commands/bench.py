"""`stacx bench`: the built-in benchmark suites, run offline from a local copy, scored by each
suite's own rule (docs/benchmarks.md).

    stacx bench list
    stacx bench prepare SUITE --from PATH
    stacx bench run SUITE CONFIG --from PATH [--samples K] [--json OUT] [--compare OLD]
    stacx bench score SUITE RESULTS [--k K] [--json OUT] [--compare OLD]
    stacx bench images swe-bench-verified --from PATH --repos DIR [--force]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="built-in benchmark suites with their own metrics")
    sub = bench.add_subparsers(dest="bench_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="every suite with its metric and input layout")
    listing.set_defaults(func=_list)

    prepare = sub.add_parser("prepare", help="check a downloaded copy of a suite")
    prepare.add_argument("suite", help="suite name (stacx bench list)")
    prepare.add_argument("--from", dest="source", required=True, help="the suite's local copy")
    prepare.set_defaults(func=_prepare)

    run = sub.add_parser("run", help="evaluate a policy on a suite (a rollout-only evaluation)")
    run.add_argument("suite", help="suite name (stacx bench list) or package.module:Suite")
    run.add_argument("config", help="rollout YAML, as for stacx eval (its data section is replaced)")
    run.add_argument("--from", dest="source", required=True, help="the suite's local copy")
    run.add_argument("--samples", type=int, default=None, help="samples per task (1: greedy)")
    run.add_argument("--k", type=int, default=None, help="best-of-k (default: --samples)")
    run.add_argument("--scaffold", default=None, help="scaffold instead of the suite's")
    run.add_argument("--grader", default=None,
                     help="grader instead of the suite's own (math suites: math-verify; stacx bench list)")
    run.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    run.add_argument("--publish", action="store_true", help="also publish trajectories")
    run.add_argument("--json", dest="json_out", default=None, help="write the result file here")
    run.add_argument("--compare", default=None, help="a previous result file to compare with")
    run.add_argument("--no-progress", action="store_true", help="no live progress view")
    run.set_defaults(func=_run)

    score = sub.add_parser("score", help="score a result file again (its per-sample rewards)")
    score.add_argument("suite", help="suite name (stacx bench list)")
    score.add_argument("results", help="a result file (stacx bench run --json, or that shape)")
    score.add_argument("--k", type=int, default=None, help="best-of-k (default: the file's)")
    score.add_argument("--json", dest="json_out", default=None, help="write the result file here")
    score.add_argument("--compare", default=None, help="a previous result file to compare with")
    score.set_defaults(func=_score)

    images = sub.add_parser("images", help="build SWE-bench instance images here (no registry)")
    images.add_argument("suite", help="swe-bench-verified")
    images.add_argument("--from", dest="source", required=True, help="the instances file or folder")
    images.add_argument("--repos", required=True,
                        help="folder of git copies of the repositories (owner+name/ or owner/name/)")
    images.add_argument("--force", action="store_true", help="rebuild images that are present")
    images.set_defaults(func=_images)


def _console() -> Any:
    """Tables on stderr: the terminal's width, or 200 columns into a file or pipe (a log keeps
    every column whole)."""
    from rich.console import Console

    return Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _fail(action: str, line: str, status: int = 2) -> int:
    """One line on stderr, `stacx bench: ACTION: line` (`stacx bench: FILE: ...` for a config)."""
    print(f"stacx bench: {action}: {line}" if action else f"stacx bench: {line}", file=sys.stderr)
    return status


def _suite(ref: str, action: str) -> Any:
    from stacx.infra.benchmarks import build_suite
    from stacx.schemas.plugins import PluginError

    try:
        return build_suite(ref)
    except PluginError as exc:
        _fail(action, str(exc))
        return None


def _list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from stacx.infra.benchmarks import BENCHMARKS, build_suite

    table = Table(title="benchmark suites (stacx bench run SUITE CONFIG --from PATH)")
    for column in ("suite", "metric", "graders (--grader; first: default)", "input layout", "origin"):
        table.add_column(column)
    for info in BENCHMARKS.available():
        suite = build_suite(info.name)
        graders = ", ".join(getattr(suite, "graders", None) or {}) or "the suite's own"
        table.add_row(info.name, suite.metric, graders, suite.layout, info.origin)
    Console(width=200).print(table)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    suite = _suite(args.suite, "prepare")
    if suite is None:
        return 2
    path = Path(args.source)
    if not path.exists():
        return _fail("prepare", f"--from {path}: does not exist; see docs/benchmarks.md for what to "
                                f"download for {suite.name} and where to put it")
    problems = suite.prepare(path)
    for line in problems:
        print(line, file=sys.stderr)
    loaded = suite.load(path)
    print(f"{suite.name}: {len(loaded.tasks)} tasks ready at {path}"
          + (f", {len(problems)} problem(s) above" if problems else ""))
    return 1 if problems or not loaded.tasks else 0


def _run(args: argparse.Namespace) -> int:

    from stacx.infra.benchmarks import TaskOutcome
    from stacx.rollout.service import run_rollout

    suite = _suite(args.suite, "run")
    if suite is None:
        return 2
    for flag, value in (("--samples", args.samples), ("--k", args.k), ("--limit", args.limit)):
        if value is not None and value < 1:
            return _fail("run", f"{flag} {value}: use a number >= 1")
    path = Path(args.source)
    if not path.exists():
        return _fail("run", f"--from {path}: does not exist; `stacx bench prepare {suite.name} --from PATH`")
    grader = _grader(suite, args.grader)
    if grader is None:
        return 2
    loaded = suite.load(path)
    for line in loaded.problems:
        print(line if line.endswith("skipped") else f"{line}; skipped", file=sys.stderr)
    every = _unique(loaded.tasks)
    tasks = every[: args.limit] if args.limit else every
    if not tasks:
        return _fail("run", f"--from {path}: no usable {suite.name} task; `stacx bench prepare` says why")
    with tempfile.TemporaryDirectory(prefix="stacx-bench-") as scratch:
        config = _config(args, suite, tasks, Path(scratch) / "tasks.jsonl", grader)
        if config is None:
            return 2
        summary = asyncio.run(run_rollout(config, tasks=tasks))
    samples = config.data.samples_per_task
    k = args.k or samples
    outcomes = [TaskOutcome(t.task_id, _padded(summary.components_by_task.get(t.task_id, []), samples),
                            str(t.metadata.get("group", ""))) for t in tasks]
    outcomes += _not_run(every[len(tasks):], loaded.problems, samples)
    run = {"config": args.config, "from": str(path), "samples_per_task": samples, "grader": grader[0],
           "tasks_run": len(tasks), "tasks_skipped": len(loaded.problems),
           "tasks_cut_by_limit": len(every) - len(tasks),
           "episodes": summary.num_episodes, "by_status": summary.by_status,
           "wall_s": round(summary.wall_s, 3)}
    status = _report(args, suite, outcomes, k, run, _console())
    if summary.stopped_by is not None:
        print(f"stacx bench: run: stopped by {summary.stopped_by.name}", file=sys.stderr, flush=True)
        return 128 + summary.stopped_by.value
    return status


NOT_RUN = {"reward": 0.0, "not_run": 1.0}
"""A sample that never ended (lost, or its task skipped or cut by --limit): a failure, as the
suites count it."""


def _padded(samples: list[dict[str, float]], planned: int) -> list[dict[str, float]]:
    """`samples` with a failed sample for each planned one that did not end."""
    return samples + [dict(NOT_RUN) for _ in range(planned - len(samples))]


def _not_run(cut: list[Any], skipped: list[str], planned: int) -> list[Any]:
    """Failures for the tasks --limit cut and the rows or tasks the suite skipped: they stay in
    the denominator, as the suites' own figures keep them."""
    from stacx.infra.benchmarks import TaskOutcome

    outcomes = [TaskOutcome(t.task_id, _padded([], planned), str(t.metadata.get("group", ""))) for t in cut]
    outcomes += [TaskOutcome(f"skipped:{line.split(': ', 1)[0]}", _padded([], planned)) for line in skipped]
    return outcomes


def _grader(suite: Any, name: str | None) -> tuple[str, str] | None:
    """(grader name, reward) for `--grader name`, else the suite's own; None after one line."""
    graders: dict[str, str] = dict(getattr(suite, "graders", None) or {})
    if name is None:
        own = next(iter(graders.items()), None)
        return own or ("suite", suite.reward)
    if name not in graders:
        choices = ", ".join(graders) or f"none: {suite.name} has one grader"
        _fail("run", f"--grader {name}: {suite.name} has no such grader; use one of: {choices}")
        return None
    return name, graders[name]


def _unique(tasks: list[Any]) -> list[Any]:
    """The tasks with each id once: a repeated id (two files holding the same row) is skipped
    with one line, since results are kept per task id."""
    seen: dict[str, Any] = {}
    for task in tasks:
        if task.task_id in seen:
            print(f"{task.metadata.get('source', task.task_id)}: task id {task.task_id!r} "
                  "seen before; skipped", file=sys.stderr)
            continue
        seen[task.task_id] = task
    return list(seen.values())


def _config(args: argparse.Namespace, suite: Any, tasks: list[Any], tasks_file: Path,
            grader: tuple[str, str]) -> Any:
    """The rollout config of `args.config` with the suite's tasks and its evaluator; None after
    printing every problem (one line each)."""
    from stacx.infra.checks import rollout_problems
    from stacx.rollout.config import RolloutConfig
    from stacx.schemas.config import ConfigError, build, load_yaml

    with tasks_file.open("w") as out:
        for task in tasks:
            out.write(json.dumps(dataclasses.asdict(task)) + "\n")
    try:
        tree = load_yaml(args.config)
        data = _mapping(tree.get("data"))
        samples = args.samples or data.get("samples_per_task", 1)
        tree["data"] = {"path": str(tasks_file), "samples_per_task": samples, "seed": data.get("seed", 0)}
        manager = tree.setdefault("manager", {})
        if isinstance(manager, dict):  # anything else: the loader names the field below
            evaluators = _mapping(manager.get("evaluators"))
            samples_n = samples if isinstance(samples, int) else 1
            manager["evaluators"] = _evaluators(evaluators, suite, args.scaffold, samples_n, grader[1])
            manager["record_task_rewards"] = True
        tree["kafka"] = {**_mapping(tree.get("kafka")), "publish": args.publish, "follow_weights": False}
        config = build(RolloutConfig, tree, where=args.config)
    except ConfigError as exc:
        for line in exc.lines:
            _fail("", line)
        return None
    problems = rollout_problems(config, args.config)
    for line in problems:
        _fail("", line)
    if problems:
        return None
    config.progress = config.progress and not args.no_progress and sys.stdout.isatty()
    return config


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _evaluators(evaluators: dict[str, Any], suite: Any, scaffold: str | None, samples: int,
                reward: str) -> dict[str, Any]:
    """The one evaluator the suite's tasks run with: the config's evaluator of the suite's task
    type (else its `default`) with the grader's reward; the suite's verifier unless that evaluator
    of the suite's task type names one; the suite's scaffold (and its `scaffold_options`) unless the
    config named one for that task type or `--scaffold` did; greedy decoding for one sample per task."""
    own = suite.task_type in evaluators
    evaluator = dict(evaluators.get(suite.task_type) or evaluators.get("default") or {})
    evaluator["reward"] = reward
    verifier = getattr(suite, "verifier", None)
    if verifier and not (own and evaluator.get("verifier")):  # the config's own verifier stays
        evaluator["verifier"] = verifier
    if scaffold or not own:
        if evaluator.get("scaffold", suite.scaffold) != (scaffold or suite.scaffold):
            evaluator.pop("scaffold_options", None)  # they were another scaffold's
        evaluator["scaffold"] = scaffold or suite.scaffold
    if evaluator.get("scaffold") == suite.scaffold and getattr(suite, "scaffold_options", None):
        # the suite's options (math: no marked answer, no answer); the config's own win
        own_options = _mapping(evaluator.get("scaffold_options"))
        evaluator["scaffold_options"] = {**suite.scaffold_options, **own_options}
    if samples == 1:
        evaluator["temperature"] = 0.0
    return {suite.task_type: evaluator}


def _score(args: argparse.Namespace) -> int:

    from stacx.infra.benchmarks.report import ResultFileError, outcomes_of, read_results

    suite = _suite(args.suite, "score")
    if suite is None:
        return 2
    try:
        doc = read_results(Path(args.results))
        outcomes = outcomes_of(doc, where=args.results)
    except ResultFileError as exc:
        return _fail("score", str(exc))
    k = args.k or int(doc.get("k") or 1)
    return _report(args, suite, outcomes, k, {"results": args.results}, _console())


def _report(args: argparse.Namespace, suite: Any, outcomes: list[Any], k: int,
            run: dict[str, Any], console: Any) -> int:
    from stacx.infra.benchmarks.report import (
        ResultFileError,
        compare_lines,
        group_scores,
        group_table,
        read_results,
        result_document,
        score_table,
    )

    score = suite.score(outcomes, k=k)
    groups = group_scores(suite, outcomes, k=k)
    doc = result_document(suite.name, score, outcomes, k=k, run=run, groups=groups)
    console.print(score_table(suite.name, score))
    if groups:
        console.print(group_table(suite.name, groups))
    status = 0
    if args.compare:
        try:
            lines = compare_lines(doc, read_results(Path(args.compare)), old_path=Path(args.compare))
        except ResultFileError as exc:
            lines, status = [f"stacx bench: --compare: {exc}"], 2
        for line in lines:
            print(line, file=sys.stderr)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2))
    summary = {"suite": suite.name, "metric": score.metric, "value": score.value,
               "interval": list(score.interval), "interval_method": score.interval_method,
               "k": k, "tasks": len(outcomes), **score.extra, **doc["denominator"],
               "groups": {name: {"value": g.value, "interval": list(g.interval), **g.extra}
                          for name, g in groups.items()}}
    if "grader" in run:
        summary["grader"] = run["grader"]
    print(json.dumps(summary))
    return status


def _images(args: argparse.Namespace) -> int:
    """Build the image of every instance row that carries its environment commands."""
    from stacx.infra.benchmarks.rows import data_files, read_rows
    from stacx.infra.services.errors import InfraError
    from stacx.infra.services.swebench_images import ENVIRONMENT_FIELD, build_instance_image

    suite = _suite(args.suite, "images")
    if suite is None:
        return 2
    if suite.name != "swe-bench-verified":
        return _fail("images", f"{suite.name}: only swe-bench-verified has instance images to build")
    path, repos = Path(args.source), Path(args.repos)
    for flag, value in (("--from", path), ("--repos", repos)):
        if not value.exists():
            return _fail("images", f"{flag} {value}: does not exist")
    loaded = suite.load(path)
    for line in loaded.problems:
        print(line, file=sys.stderr)
    ids = {t.task_id for t in loaded.tasks}
    rows = [row for file in data_files(path) for _, row in read_rows(file)
            if isinstance(row, dict) and row.get("instance_id") in ids]
    status = 0
    for row in rows:  # Ctrl-C / SIGTERM: the docker build is killed, the CLI says so in one line
        if not isinstance(row.get(ENVIRONMENT_FIELD), list):
            print(f"{row['instance_id']}: no {ENVIRONMENT_FIELD} (its environment commands); skipped; "
                  f"load the harness's image {row['image']} instead", file=sys.stderr)
            continue
        try:
            build_instance_image(row, repos, force=args.force, say=lambda line: print(line, flush=True))
        except InfraError as exc:
            status = _fail("images", f"{row['instance_id']}: {exc}", status=1)
    return status
