"""The `stacx` command line: one subcommand module per service under `infra/commands/`.

Each module in `infra.commands` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`; `func(args) -> int` is the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from infra import commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stacx", description="STACX: Kafka-centred infrastructure for agentic RL of LLMs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"infra.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        sys.exit(2)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
