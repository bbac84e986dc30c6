"""`stacx oncall CONFIG` (online learner), `stacx oncall-join CONFIG` (feedback join worker),
`stacx oncall-rollback CONFIG --to VERSION` and `stacx oncall-versions CONFIG`.

One YAML file serves all four: `bootstrap_servers`, `oncall` (OnlineLearner.Config without its
trainer), `trainer` (TrainerConfig), `evaluation` (HeldOutEvaluator.Config), `join`
(OncallJoinApp.Config). See docs/oncall.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("stacx.oncall")


def register(subparsers: Any) -> None:
    learner = subparsers.add_parser(
        "oncall",
        help="online learner: train on rewarded production trajectories, gate and deploy new versions",
    )
    learner.add_argument("config", type=Path, help="on-call YAML (examples/oncall/oncall.yaml)")
    learner.add_argument("--max-steps", type=int, help="stop after this many steps in total")
    learner.add_argument(
        "--explain", action="store_true", help="validate the file (scorer included); start nothing"
    )
    learner.set_defaults(func=_learn)

    join = subparsers.add_parser(
        "oncall-join", help="Faust worker: agent logs x delayed feedback -> rewarded trajectories"
    )
    join.add_argument("config", type=Path)
    join.add_argument("--loglevel", default="info")
    join.set_defaults(func=_join)

    rollback = subparsers.add_parser("oncall-rollback", help="deploy an earlier version again")
    rollback.add_argument("config", type=Path)
    rollback.add_argument(
        "--to",
        type=int,
        required=True,
        metavar="VERSION",
        help="deployed version to go back to (see `stacx oncall-versions`)",
    )
    rollback.set_defaults(func=_rollback)

    versions = subparsers.add_parser("oncall-versions", help="promotions, rejections, rollbacks")
    versions.add_argument("config", type=Path)
    versions.set_defaults(func=_versions)


def _tree(path: Path) -> dict[str, Any]:
    from stacx.infra.config import load_yaml

    return load_yaml(path)


def learner_config(tree: dict[str, Any], source: str) -> Any:
    from stacx.infra.config import bootstrap_servers, build
    from stacx.trainer import TrainerConfig
    from stacx.trainer.oncall import OnlineLearner

    data = dict(tree.get("oncall") or {})
    data.setdefault("bootstrap_servers", bootstrap_servers(tree))
    data["trainer"] = build(TrainerConfig, dict(tree.get("trainer") or {}), where=f"{source}: trainer")
    return build(OnlineLearner.Config, data, where=f"{source}: oncall")


def join_config(tree: dict[str, Any], source: str) -> Any:
    from stacx.consumers.oncall import OncallJoinApp
    from stacx.infra.config import bootstrap_servers, build

    data = dict(tree.get("join") or {})
    data.setdefault("bootstrap_servers", bootstrap_servers(tree))
    return build(OncallJoinApp.Config, data, where=f"{source}: join")


def _learn(args: argparse.Namespace) -> int:
    from stacx.infra.config import ConfigError, build
    from stacx.trainer.errors import TrainerError
    from stacx.trainer.oncall import HeldOutEvaluator, KafkaWeightLog, OnlineLearner, load_scorer

    try:
        tree = _tree(args.config)
        config = learner_config(tree, str(args.config))
        evaluation = build(
            HeldOutEvaluator.Config, dict(tree.get("evaluation") or {}), where=f"{args.config}: evaluation"
        )
        load_scorer(evaluation.scorer)  # imported before anything starts: a bad one is one line
    except (ConfigError, TrainerError, ValueError) as exc:
        _say(exc)
        return 2
    if args.explain:
        return 0
    staging = None
    if not evaluation.staging_url:
        staging = _staging_server(config)
        evaluation.staging_url = staging.base_url
    weights = KafkaWeightLog(config.bootstrap_servers, config.weights_topic)
    learner = None
    try:
        learner = OnlineLearner(config, evaluator=HeldOutEvaluator(evaluation), weight_log=weights)
        learner.run(args.max_steps)
    finally:
        if learner is not None:
            learner.close()
        weights.close()
        if staging is not None:
            staging.stop()
    return 0


def _say(exc: BaseException) -> None:
    for line in str(exc).splitlines():
        print(f"stacx oncall: {line}", file=sys.stderr)


def _staging_server(config: Any) -> Any:
    """A private inference server for the gate's evaluations (never serves users)."""
    from stacx.rollout.inference import InferenceServer

    path = config.trainer.models["policy"].path
    server = InferenceServer(
        InferenceServer.Config(model_path=path, port=0, torch_threads=1, served_model_name="staging")
    )
    server.start()
    log.info("staging server for the promotion gate at %s", server.base_url)
    return server


def _join(args: argparse.Namespace) -> int:
    from stacx.consumers.oncall import OncallJoinApp
    from stacx.infra.config import ConfigError

    try:
        config = join_config(_tree(args.config), str(args.config))
    except (ConfigError, ValueError) as exc:
        print(f"stacx oncall-join: {exc}", file=sys.stderr)
        return 2
    try:
        stopped_by = OncallJoinApp(config).run(loglevel=args.loglevel)
    except Exception as exc:  # the worker crashed (Faust re-raises the reason): one line
        print(
            f"stacx oncall-join: the join worker stopped on an error: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if stopped_by is None:
        return 0
    print(f"stacx oncall-join: stopped by {stopped_by.name}", file=sys.stderr, flush=True)
    return 128 + stopped_by.value


def _deployments(args: argparse.Namespace) -> Any:
    from stacx.trainer.oncall import Deployments, KafkaWeightLog, VersionHistory

    config = learner_config(_tree(args.config), str(args.config))
    history = VersionHistory(Path(config.state_dir) / "versions.jsonl")
    return Deployments(
        history, KafkaWeightLog(config.bootstrap_servers, config.weights_topic), config.model_name
    )


def _rollback(args: argparse.Namespace) -> int:
    from stacx.infra.config import ConfigError
    from stacx.trainer.errors import TrainerError

    try:
        deployments = _deployments(args)
    except (ConfigError, TrainerError, ValueError) as exc:
        print(f"stacx oncall-rollback: {exc}", file=sys.stderr)
        return 2
    try:
        version = deployments.rollback(args.to)
    except (ConfigError, TrainerError) as exc:
        print(f"stacx oncall-rollback: {exc}", file=sys.stderr)
        return 2
    finally:
        deployments.log.close()
    print(json.dumps({"deployed_version": version.version, "rollback_to": args.to, "path": version.path}))
    return 0


def _versions(args: argparse.Namespace) -> int:
    from stacx.trainer.oncall import VersionHistory

    config = learner_config(_tree(args.config), str(args.config))
    for entry in VersionHistory(Path(config.state_dir) / "versions.jsonl").entries():
        report = entry.get("report") or {}
        print(
            json.dumps(
                {
                    k: entry.get(k)
                    for k in ("kind", "step", "deployed_version", "rollback_to", "reasons")
                    if entry.get(k) is not None
                }
                | {"success_rate": report.get("success_rate"), "probe_rate": report.get("probe_rate")}
            )
        )
    return 0
