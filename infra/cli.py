"""The `stacx` command line: one subcommand module per service under `infra/commands/`.

Each module in `stacx.infra.commands` exposes `register(subparsers)`, adding its subcommands with
`set_defaults(func=...)`; `func(args) -> int` is the exit status.

Every command stops the same way on SIGINT and SIGTERM (what Ctrl-C, `timeout`, CI and service
managers send): SIGTERM is turned into SIGINT, so every `finally`, context manager and asyncio
cancellation runs and stops what the command started; then one line, no traceback, and exit status
128 + the signal number (130, 143). A second SIGTERM while stopping is ignored.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import signal
import sys
from typing import Any

from stacx.infra import commands
from stacx.infra.config_flags import resolve_lazy_flags
from stacx.infra.telemetry import setup_metrics, setup_tracing


def build_parser(
    argv: list[str] | None = None, *, every_config_flag: bool = False
) -> argparse.ArgumentParser:
    """The whole command line; the flags generated from a command's config class are added for
    the command `argv` runs (or, with `every_config_flag`, for every command)."""
    parser = argparse.ArgumentParser(
        prog="stacx", description="STACX: Kafka-centred infrastructure for agentic RL of LLMs."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"stacx.infra.commands.{info.name}")
        module.register(sub)
    command = next((a for a in argv or [] if not a.startswith("-")), None)
    for name, command_parser in sub.choices.items():
        if every_config_flag or name == command:
            resolve_lazy_flags(command_parser)
    return parser


_received: list[signal.Signals] = []


def _on_sigterm(signum: int, frame: Any) -> None:
    if _received:
        return
    _received.append(signal.Signals(signum))
    on_sigint = signal.getsignal(signal.SIGINT)
    if callable(on_sigint):  # whatever handles Ctrl-C here (asyncio, uvicorn, ...)
        on_sigint(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job of a script): stop as Ctrl-C would have
        raise KeyboardInterrupt


def _stopping_signal() -> signal.Signals:
    return _received[0] if _received else signal.SIGINT


def _run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        setup_tracing(str(args.command))
        if args.command != "train":  # the trainer sets them up in the rank that records them
            setup_metrics(str(args.command))
    except ValueError as exc:  # a bad OTEL_* variable: one line naming it
        print(f"stacx {args.command}: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # stopping already: a second signal waits
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        received = _stopping_signal()
        print(f"stacx {args.command}: stopped by {received.name}", file=sys.stderr, flush=True)
        return 128 + received.value


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # one line per HTTP request drowns the services' own progress lines
        for chatty in ("httpx", "httpcore"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    if not getattr(args, "func", None):
        parser.print_help()
        sys.exit(2)
    code = _run(args)
    if _received and code < 128:  # stopped by the signal, though the command ended otherwise
        print(f"stacx {args.command}: stopped by {_received[0].name}", file=sys.stderr, flush=True)
        code = 128 + _received[0].value
    sys.exit(code)


if __name__ == "__main__":
    main()
