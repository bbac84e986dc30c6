"""`stacx demo`: the main job of `make demo` (services must be up: `stacx infra up`)."""

from __future__ import annotations

import argparse

from infra.commands.infra import _smoke


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("demo", help="what `make demo` runs after `stacx infra up`")
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    return int(_smoke(args))
