"""`stacx train CONFIG` (run the trainer) and `stacx recipes` (list the shipped recipes)."""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from pathlib import Path
from typing import Any

from stacx.infra.config import EXPLAIN_HELP, explained
from stacx.infra.config_flags import config_overrides, deep_merge, lazy_config_flags
from stacx.infra.telemetry import setup_metrics, setup_rank

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
    lazy_config_flags(p, "stacx.trainer.config:TrainerConfig")
    p.add_argument("--explain", action="store_true", help=EXPLAIN_HELP)
    p.set_defaults(func=_train)
    r = subparsers.add_parser("recipes", help="list the registered training recipes")
    r.set_defaults(func=_recipes)


def load_trainer_config(path: str, overrides: argparse.Namespace | None = None) -> Any:
    """TrainerConfig from a YAML file (the whole file, or its `trainer:` section) with the command
    line's generated field flags (`overrides`: `--optimizer.lr 1e-4`) on top, validated with the
    model paths and the recipe resolved; `ConfigError` lists every problem, one line each. When
    the config spawns local ranks they resolve the recipe (it imports torch, which the launcher
    never does) and a bad one is still one line."""
    from stacx.infra.checks import model_problem
    from stacx.infra.config import ConfigError, build, load_yaml
    from stacx.schemas.config import file_section
    from stacx.trainer.config import TrainerConfig
    from stacx.trainer.ranks import spawns_ranks

    tree, where = file_section(load_yaml(path), "trainer", TrainerConfig, path)
    given = config_overrides(overrides) if overrides is not None else {}
    config = build(TrainerConfig, deep_merge(tree, given), where=where)
    lines = []
    for role, model in sorted(config.models.items()):
        problem = model.path and model_problem(Path(model.path), f"models.{role}.path")
        if problem:
            lines.append(f"{where}: {problem}")
    if not spawns_ranks(config.backend):
        problems = _recipe_problems(config.recipe, config.role_options, where)
        if problems and not problems[0].startswith(f"{where}: "):  # the recipe itself
            field = "--recipe" if "recipe" in given else f"{where}: recipe"
            problems[0] = f"{field}: {problems[0]}"
        lines += problems
    if lines:
        raise ConfigError(lines)
    return config


def _recipe_problems(ref: str, role_options: dict[str, Any], where: str) -> list[str]:
    """The recipe resolves and `role_options` are options it declares (one line each)."""
    from stacx.trainer.errors import TrainerError
    from stacx.trainer.recipe import get_recipe, role_options_problems

    try:
        recipe = get_recipe(ref)
    except TrainerError as exc:
        return [str(exc)]
    return [f"{where}: {line}" for line in role_options_problems(recipe, ref, role_options)]


def _train(args: argparse.Namespace) -> int:
    from stacx.infra.config import ConfigError
    from stacx.trainer.errors import ConfigError as TrainerConfigError
    from stacx.trainer.errors import TrainerError
    from stacx.trainer.ranks import spawns_ranks

    try:
        config = load_trainer_config(args.config, args)
    except (ConfigError, TrainerError) as exc:
        _print_lines(exc)
        return 2
    if args.explain:
        print(explained(config), end="")
        return 0
    if config.source.kind == "kafka":
        from stacx.infra.services.reachability import kafka_problem

        unreachable = kafka_problem(config.source.bootstrap_servers)
        if unreachable:
            print(f"stacx train: {unreachable}", file=sys.stderr)
            return 1
    rank_setup = functools.partial(setup_rank, "train")
    try:
        if spawns_ranks(config.backend):
            return _spawn_ranks(config, rank_setup, args)
        from stacx.trainer import StacxTrainer

        setup_metrics("train")
        StacxTrainer.launch(config, rank_setup=rank_setup)
    except TrainerConfigError as exc:  # found at construction: a configuration error, exit 2
        _print_lines(exc)
        return 2
    except TrainerError as exc:
        log.error("%s", exc)
        return 1
    return 0


def _spawn_ranks(config: Any, rank_setup: Any, args: argparse.Namespace) -> int:
    """Train on spawned local ranks; a config problem one of them found is one line, exit 2."""
    from stacx.trainer.errors import ConfigError, RecipeError
    from stacx.trainer.ranks import spawn_trainer

    try:
        spawn_trainer(config, rank_setup=rank_setup)
    except RecipeError as exc:  # what the launcher would have reported before spawning
        field = "--recipe" if "recipe" in config_overrides(args) else f"{args.config}: recipe"
        _print_lines(f"{field}: {exc}")
        return 2
    except ConfigError as exc:
        _print_lines(exc)
        return 2
    return 0


def _print_lines(message: object) -> None:
    for line in str(message).splitlines():
        print(f"stacx train: {line}", file=sys.stderr)


def _recipes(args: argparse.Namespace) -> int:
    from stacx.trainer import list_recipes

    entries = list_recipes()
    width = max(len(name) for name, _ in entries)
    for name, description in entries:
        print(f"{name:<{width}}  {description}")
    return 0
