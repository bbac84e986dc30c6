"""`stacx train CONFIG` (run the trainer) and `stacx recipes` (list the shipped recipes)."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any

from infra.telemetry import setup_metrics, setup_rank

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="train from stacx.batches with a recipe (FSDP2 or "
        "single process); exports weights and publishes WeightVersions",
    )
    p.add_argument(
        "config",
        help="trainer YAML (TrainerConfig; or a file with a `trainer:` section), see examples/train/",
    )
    p.add_argument("--recipe", help="override `recipe`")
    p.add_argument("--max-steps", type=int, help="override `max_steps`")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers for the source and publisher")
    p.add_argument("--topic", help="override `source.topic` (the TrainingBatch topic)")
    p.add_argument("--group-id", help="override `source.group_id`")
    p.add_argument("--world-size", type=int, help="spawn this many local ranks (implies fsdp2)")
    p.add_argument("--replay-from-offset", type=int, help="replay the batch topic from an offset")
    p.add_argument("--replay-from-timestamp-ms", type=int, help="replay from a time (epoch ms)")
    p.set_defaults(func=_train)
    r = subparsers.add_parser("recipes", help="list the registered training recipes")
    r.set_defaults(func=_recipes)


def _apply_overrides(config: Any, args: argparse.Namespace) -> None:
    if args.recipe:
        config.recipe = args.recipe
    if args.max_steps is not None:
        config.max_steps = args.max_steps
    if args.bootstrap:
        config.source.bootstrap_servers = config.export.bootstrap_servers = args.bootstrap
    if args.topic:
        config.source.topic = args.topic
    if args.group_id:
        config.source.group_id = args.group_id
    if args.world_size:
        config.backend.kind, config.backend.world_size = "fsdp2", args.world_size
    if args.replay_from_offset is not None:
        config.source.replay_from_offset = args.replay_from_offset
    if args.replay_from_timestamp_ms is not None:
        config.source.replay_from_timestamp_ms = args.replay_from_timestamp_ms


def load_trainer_config(path: str) -> Any:
    """TrainerConfig from a YAML file (the whole file, or its `trainer:` section), validated with
    the model path and recipe resolved; `ConfigError` lists every problem, one line each."""
    from infra.checks import model_problem
    from infra.config import ConfigError, build, load_yaml
    from trainer import TrainerConfig, TrainerError, get_recipe

    tree = load_yaml(path)
    where = path
    if isinstance(tree.get("trainer"), dict):  # a shared stack file: use its `trainer` section
        tree, where = tree["trainer"], f"{path}: trainer"
    config = build(TrainerConfig, tree, where=where)
    lines = []
    for role, model in sorted(config.models.items()):
        problem = model.path and model_problem(Path(model.path), f"models.{role}.path")
        if problem:
            lines.append(f"{where}: {problem}")
    try:
        get_recipe(config.recipe)  # before spawning ranks
    except TrainerError as exc:
        lines.append(f"{where}: recipe: {exc}")
    if lines:
        raise ConfigError(lines)
    return config


def _train(args: argparse.Namespace) -> int:
    from infra.config import ConfigError
    from trainer import StacxTrainer, TrainerError, get_recipe

    try:
        config = load_trainer_config(args.config)
        _apply_overrides(config, args)
        get_recipe(config.recipe)  # a --recipe override, before spawning ranks
    except (ConfigError, TrainerError) as exc:
        for line in str(exc).splitlines():
            print(f"stacx train: {line}", file=sys.stderr)
        return 2
    if config.source.kind == "kafka":
        from infra.services.reachability import kafka_problem

        unreachable = kafka_problem(config.source.bootstrap_servers)
        if unreachable:
            print(f"stacx train: {unreachable}", file=sys.stderr)
            return 1
    try:
        spawns = config.backend.kind == "fsdp2" and config.backend.world_size > 1 and "RANK" not in os.environ
        if not spawns:
            setup_metrics("train")
        StacxTrainer.launch(config, rank_setup=functools.partial(setup_rank, "train"))
    except TrainerError as exc:
        log.error("%s", exc)
        return 1
    return 0


def _recipes(args: argparse.Namespace) -> int:
    from trainer import list_recipes

    entries = list_recipes()
    width = max(len(name) for name, _ in entries)
    for name, description in entries:
        print(f"{name:<{width}}  {description}")
    return 0
