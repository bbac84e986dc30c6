"""`stacx assemble`: run the Faust batch assembler (trajectories -> training batches)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from stacx.infra.config import EXPLAIN_HELP, explained
from stacx.infra.config_flags import config_overrides, deep_merge, lazy_config_flags
from stacx.infra.heap import freeze_startup_heap


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "assemble", help="run the batch assembler (Faust worker): trajectories -> batches"
    )
    p.add_argument("--config", help="YAML file; its `assembler` section is AssemblerApp.Config")
    lazy_config_flags(p, "stacx.consumers.assembly:AssemblerApp.Config")
    p.add_argument("--loglevel", default="info", help="worker log level")
    p.add_argument("--explain", action="store_true", help=EXPLAIN_HELP)
    p.set_defaults(func=_assemble)


def build_config(args: argparse.Namespace) -> Any:
    """AssemblerApp.Config from the YAML file's `assembler:` section (if any) with the generated
    field flags given on top (`--grouping.group_size 8`)."""
    from stacx.consumers.assembly import AssemblerApp
    from stacx.infra.config import ConfigError, bootstrap_servers, build, load_yaml

    tree = load_yaml(args.config) if args.config else {}
    source = args.config or "command line"
    section = tree.get("assembler") or {}
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"{source}: section `assembler` must be a mapping of AssemblerApp.Config fields, "
            f"got {type(section).__name__} ({section!r})"
        )
    data = dict(section)
    _refuse_shared_topics(tree, data, args, source)
    data.setdefault("bootstrap_servers", bootstrap_servers(tree))
    data = deep_merge(data, config_overrides(args))
    return build(AssemblerApp.Config, data, where=f"{source}: assembler")


def _refuse_shared_topics(tree: Mapping[str, Any], data: Mapping[str, Any], args: argparse.Namespace,
                          source: str) -> None:
    """A pipeline file's `assembler:` section gets its run's topics from `stacx run`: alone, it
    would read and write the shared default topics (other runs' data). Refused, naming the fix."""
    from stacx.infra.config import ConfigError

    pipeline = tree.get("pipeline")
    if not isinstance(pipeline, Mapping) or pipeline.get("fresh_topics") is False:
        return
    run_dir = f"{pipeline.get('runs_dir', 'runs')}/{pipeline.get('name', 'quickstart')}"
    topics = ("trajectories_topic", "batches_topic")
    given = {**data, **config_overrides(args)}
    if not all(given.get(key) for key in topics):
        raise ConfigError(
            f"{source}: assembler: a pipeline file's section gets per-run topics from `stacx run` "
            f"(pipeline.fresh_topics); run the service file the run writes under {run_dir}/config/, "
            "or set assembler.trajectories_topic and assembler.batches_topic (or --trajectories_topic "
            "and --batches_topic)"
        )


def _dlq_problem(config: Any) -> str | None:
    """A mistyped `dlq_topic` would be auto-created (with the broker's default retention): the
    dead-letter topic must exist (`stacx infra up` creates stacx.dlq)."""
    from stacx.infra.services.topics import missing_topics

    missing = missing_topics(config.bootstrap_servers, [config.dlq_topic], timeout_s=10.0)
    if not missing:  # there, or the cluster did not answer (the worker reports that itself)
        return None
    return (
        f"assembler.dlq_topic={config.dlq_topic!r}: no such topic on {config.bootstrap_servers}; "
        "check the name, or create it (`stacx infra up` creates stacx.dlq)"
    )


def _assemble(args: argparse.Namespace) -> int:
    from stacx.consumers.assembly import AssemblerApp, AssemblyError
    from stacx.infra.config import ConfigError
    from stacx.infra.services.reachability import kafka_problem

    try:
        config = build_config(args)
        if args.explain:
            print(explained(config), end="")
            return 0
        unreachable = kafka_problem(config.bootstrap_servers)
        if unreachable:
            print(f"stacx assemble: {unreachable}", file=sys.stderr)
            return 1
        problem = _dlq_problem(config)
        if problem:
            raise ConfigError(problem)
        assembler = AssemblerApp(config)
    except (ConfigError, AssemblyError) as exc:
        for line in str(exc).splitlines():
            print(f"stacx assemble: {line}", file=sys.stderr)
        return 2
    freeze_startup_heap("assemble")
    try:
        stopped_by = assembler.run(loglevel=args.loglevel)
    except AssemblyError as exc:
        print(f"stacx assemble: {exc}", file=sys.stderr)
        return 1
    if stopped_by is None:
        return 0
    print(f"stacx assemble: stopped by {stopped_by.name}", file=sys.stderr, flush=True)
    return 128 + stopped_by.value
