"""`stacx plugins [POINT]`: every plug-in a config can name, per extension point, and its origin.
A broken entry point (does not import, wrong signature) and one shadowed by a name of ours are
said on stderr, one line each; a broken one makes the exit status 1."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

_OWNERS = (
    "stacx.rollout.rewards",
    "stacx.rollout.scaffolds",
    "stacx.rollout.blackbox.adapter",
    "stacx.rollout.data",
    "stacx.rollout.scheduler",
    "stacx.rollout.inference.serving",
    "stacx.trainer.recipe",
    "stacx.trainer.oncall.evaluation",
    "stacx.infra.tracking",
    "stacx.infra.benchmarks",
)
"""Modules that own an extension point's registry (importing them creates it)."""


def register(subparsers: Any) -> None:
    plugins = subparsers.add_parser("plugins", help="list the plug-ins of every extension point")
    plugins.add_argument("point", nargs="?", help="only this point (e.g. rewards, scaffolds, recipes)")
    plugins.set_defaults(func=_plugins)


def _plugins(args: argparse.Namespace) -> int:
    from stacx.schemas.plugins import registries

    for module in _OWNERS:
        importlib.import_module(module)
    points = registries()
    if args.point and args.point not in points:
        known = sorted(points)
        print(f"stacx plugins: no extension point {args.point!r}; use one of {known}", file=sys.stderr)
        return 2
    broken = 0
    for name in [args.point] if args.point else sorted(points):
        registry = points[name]
        print(f"{name}  (entry-point group {registry.group}; or package.module:object)")
        for info in registry.available():
            summary = f"  {info.summary}" if info.summary else ""
            print(f"  {info.name:<18} {info.origin}{summary}")
            if info.problem:
                broken += info.problem.startswith("broken")
                print(f"stacx plugins: {name}: {info.name}: {info.problem}", file=sys.stderr)
    return 1 if broken else 0
