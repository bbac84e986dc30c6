"""`stacx rollout CONFIG` (the rollout service) and `stacx eval CONFIG` (rollout-only evaluation)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from stacx.infra.config import EXPLAIN_HELP, explained
from stacx.infra.config_flags import config_overrides, lazy_config_flags
from stacx.infra.heap import freeze_startup_heap


def register(subparsers: Any) -> None:
    rollout = subparsers.add_parser("rollout", help="run the rollout service from a YAML config")
    rollout.add_argument("config", help="rollout YAML (see examples/rollout/)")
    lazy_config_flags(rollout, "stacx.rollout.config:RolloutConfig")
    rollout.add_argument("--explain", action="store_true", help=EXPLAIN_HELP)
    rollout.set_defaults(func=_rollout)

    evaluate = subparsers.add_parser("eval", help="rollout-only evaluation: rewards per task type")
    evaluate.add_argument("config", help="rollout YAML (see examples/rollout/eval-tasks.yaml)")
    evaluate.add_argument("--tasks", default=None, help="Harbor task directory (overrides data)")
    evaluate.add_argument("--samples", type=int, default=None, help="samples per task")
    evaluate.add_argument("--publish", action="store_true", help="also publish trajectories")
    evaluate.add_argument("--json", dest="json_out", default=None, help="write the report here")
    evaluate.add_argument("--no-progress", action="store_true", help="no live progress view")
    evaluate.set_defaults(func=_eval)


def load_rollout_config(path: str, overrides: dict[str, Any] | None = None) -> Any:
    """RolloutConfig from a YAML file with the command line's field flags (`overrides`) on top,
    validated, with everything it points at resolved (evaluators, tokenizer, tasks);
    `ConfigError` lists every problem, one line each."""
    from stacx.infra.checks import rollout_problems
    from stacx.infra.config import ConfigError
    from stacx.rollout.config import load_config

    config = load_config(path, overrides)  # the one loader; relative data paths against the file
    lines = rollout_problems(config, path)
    if lines:
        raise ConfigError(lines)
    return config


def _load(path: str, args: argparse.Namespace) -> Any:
    from stacx.infra.config import ConfigError

    try:
        config = load_rollout_config(path, config_overrides(args))
    except ConfigError as exc:
        for line in exc.lines:
            print(f"stacx {getattr(args, 'command', 'rollout')}: {line}", file=sys.stderr)
        return None
    config.progress = config.progress and not getattr(args, "no_progress", False) and sys.stdout.isatty()
    return config


def _rollout(args: argparse.Namespace) -> int:
    from stacx.rollout.errors import ServicesNotReadyError
    from stacx.rollout.service import run_rollout

    config = _load(args.config, args)
    if config is None:
        return 2
    if args.explain:
        print(explained(config), end="")
        return 0
    kafka = config.kafka
    if kafka.publish or kafka.follow_weights or config.data.topic:
        from stacx.infra.services.reachability import kafka_problem

        unreachable = kafka_problem(kafka.bootstrap_servers)
        if unreachable:
            print(f"stacx rollout: {unreachable}", file=sys.stderr)
            return 1
    tasks = _harbor_tasks(config.data.task_dirs) if config.data.task_dirs else None
    freeze_startup_heap("rollout")
    try:
        summary = asyncio.run(run_rollout(config, tasks=tasks))
    except ServicesNotReadyError as exc:  # inference.wait_ready_s ran out
        print(f"stacx rollout: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(_report(summary)))
    if summary.stopped_by is not None:
        print(f"stacx rollout: stopped by {summary.stopped_by.name}", file=sys.stderr, flush=True)
        return 128 + summary.stopped_by.value
    return 0 if summary.num_publish_errors == 0 else 1


def _harbor_tasks(directory: str) -> list[Any]:
    """TaskSamples of every runnable task under `directory`; each broken or unsupported task is
    skipped with one line on stderr (the others still run)."""
    from stacx.sandbox.errors import SandboxError
    from stacx.sandbox.tasks import find_task_dirs, load_task, to_task_sample

    samples = []
    for path in find_task_dirs(directory):
        try:
            task = load_task(path)
        except SandboxError as exc:
            print(f"skipped {path}: {exc}", file=sys.stderr)
            continue
        if task.unsupported:
            print(f"skipped {task.name}: {task.unsupported}", file=sys.stderr)
            continue
        samples.append(to_task_sample(task))
    return samples


def _eval(args: argparse.Namespace) -> int:
    from rich.console import Console

    from stacx.rollout.config import DataConfig
    from stacx.rollout.progress import reward_table
    from stacx.rollout.service import run_rollout

    config = _load(args.config, args)
    if config is None:
        return 2
    if args.tasks:
        config.data = DataConfig(task_dirs=args.tasks, samples_per_task=config.data.samples_per_task)
    if args.samples:
        config.data.samples_per_task = args.samples
    config.kafka.publish = args.publish
    config.kafka.follow_weights = False
    config.manager.record_task_rewards = True
    tasks = _harbor_tasks(config.data.task_dirs) if config.data.task_dirs else None
    summary = asyncio.run(run_rollout(config, tasks=tasks))
    report = _report(summary)
    rows = {t: (summary.episodes_by_type[t], r) for t, r in summary.mean_reward_by_type().items()}
    Console(stderr=True).print(reward_table(rows))
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(report, out, indent=2)
    print(json.dumps(report))
    return 0


def _report(summary: Any) -> dict[str, Any]:
    by_task = {t: sum(r) / len(r) for t, r in sorted(summary.rewards_by_task.items()) if r}
    return {
        "groups": summary.num_groups,
        "episodes": summary.num_episodes,
        "by_status": summary.by_status,
        "mean_reward_by_type": summary.mean_reward_by_type(),
        "mean_reward_by_task": by_task,
        "publish_errors": summary.num_publish_errors,
        "out_of_vocabulary": summary.num_out_of_vocabulary,
        "max_concurrent_episodes": summary.max_concurrent_episodes,
        "wall_s": round(summary.wall_s, 3),
    }
