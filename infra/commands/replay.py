"""`stacx replay CONFIG`: train again from a retained trajectories topic into a run of its own
(see infra/replay.py and docs/replay.md)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay", help="train again from a retained trajectories topic into a run of its own"
    )
    p.add_argument("config", help="replay YAML (see docs/replay.md and examples/replay/)")
    p.add_argument("--name", help="override replay.name (the replay's run id)")
    p.add_argument("--source", help="override replay.source_topic")
    p.add_argument("--from-offset", type=int)
    p.add_argument("--to-offset", type=int)
    p.add_argument("--from-time", help="start at this time (ISO 8601, or epoch ms)")
    p.add_argument("--to-time", help="stop before this time (ISO 8601, or epoch ms)")
    p.add_argument("--recipe", help="override trainer.recipe")
    p.add_argument("--seed", type=int, help="override trainer.seed")
    p.set_defaults(func=_replay)


def epoch_ms(value: str) -> int:
    if value.isdigit():
        return int(value)
    return int(datetime.fromisoformat(value).timestamp() * 1000)


def load(args: argparse.Namespace) -> Any:
    from stacx.infra.config import build, load_yaml
    from stacx.infra.replay import ReplayFile, role_options_for

    tree = load_yaml(args.config)
    section = dict(tree.get("replay") or {})
    overrides = {
        "name": args.name,
        "source_topic": args.source,
        "from_offset": args.from_offset,
        "to_offset": args.to_offset,
        "from_timestamp_ms": epoch_ms(args.from_time) if args.from_time else None,
        "to_timestamp_ms": epoch_ms(args.to_time) if args.to_time else None,
    }
    section.update({k: v for k, v in overrides.items() if v is not None})
    trainer = dict(tree.get("trainer") or {})
    if args.recipe and args.recipe != trainer.get("recipe", "grpo"):
        # the file's role options were written for its own recipe: keep those the new one has
        trainer["recipe"] = args.recipe
        options = dict(trainer.get("role_options") or {})
        kept, dropped = role_options_for(args.recipe, options)
        if options:
            trainer["role_options"] = kept
        for option in dropped:
            print(f"stacx replay: --recipe {args.recipe}: trainer.role_options.{option} is not an "
                  f"option of {args.recipe}, left out", file=sys.stderr)  # fmt: skip
    if args.seed is not None:
        trainer["seed"] = args.seed
    return build(ReplayFile, {**tree, "replay": section, "trainer": trainer}, where=args.config)


def _replay(args: argparse.Namespace) -> int:
    from stacx.infra.config import ConfigError
    from stacx.infra.replay import run_replay

    try:
        spec = load(args)
        summary = run_replay(spec, base_dir=Path(args.config).resolve().parent)
    except (ConfigError, ValueError) as exc:
        for line in str(exc).splitlines():
            print(f"stacx replay: {line}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in summary.items() if k != "batch_sha256"}))
    return 0
