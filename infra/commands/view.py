"""`stacx view [--config F] [--runs-dir DIR] [--port N]`: a local web app of runs, their curves and their
trajectories, on 127.0.0.1.

Runs come from the run folders (`runs/` by default) and the run topics on the broker; each run
shows its status and curves, and a browser of its trajectories read from its Kafka topic (filter by
task, reward, policy version; one trajectory turn by turn, tokens coloured by loss mask, with its
trace link). Pages of a live run refresh themselves.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

DEFAULT_PORT = 8760


VIEW_FLAGS = {
    "runs_dir": "runs_dir",
    "host": "host",
    "port": "port",
    "bootstrap_servers": "bootstrap_servers",
    "jaeger_url": "jaeger_url",
}
"""Flags that override the `view:` section of --config (argparse dest -> field)."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "view", help="web view of runs, curves and trajectories on 127.0.0.1 (no external assets)"
    )
    p.add_argument("--config", help="YAML file whose `view:` section configures the view")
    p.add_argument("--runs-dir", help="folder of run folders (default: runs)")
    p.add_argument("--host", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, help=f"port (default: {DEFAULT_PORT})")
    p.add_argument(
        "--bootstrap-servers",
        help="Kafka broker of the runs' topics (default: the file's bootstrap_servers, $STACX_KAFKA, "
        "else 127.0.0.1:9092)",
    )
    p.add_argument(
        "--jaeger-url",
        help="trace backend UI for trace links (default: $STACX_TRACE_QUERY_URL, else Jaeger's)",
    )
    p.set_defaults(func=_view)


def build_config(args: argparse.Namespace) -> Any:
    """ViewConfig from the `view:` section of --config (if any) and the command-line overrides."""
    from stacx.infra.commands.trace import DEFAULT_QUERY_URL
    from stacx.infra.config import bootstrap_servers, section_with_overrides
    from stacx.infra.view import ViewConfig

    def defaults(tree: Any) -> dict[str, Any]:
        return {
            "bootstrap_servers": bootstrap_servers(tree),
            "jaeger_url": os.environ.get("STACX_TRACE_QUERY_URL", DEFAULT_QUERY_URL),
        }

    return section_with_overrides(args, "view", ViewConfig, VIEW_FLAGS, defaults=defaults)


def _view(args: argparse.Namespace) -> int:
    import uvicorn

    from stacx.infra.config import ConfigError
    from stacx.infra.view import create_app

    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"stacx view: {exc}", file=sys.stderr)
        return 2
    problem = _cannot_listen(config.host, config.port)
    if problem is not None:
        print(
            f"stacx view: cannot listen on {config.host}:{config.port} ({problem}); pass another --port",
            file=sys.stderr,
        )
        return 2
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False)
    )
    print(
        f"stacx view: http://{config.host}:{config.port}/ "
        f"(runs from {config.runs_dir}/ and {config.bootstrap_servers})",
        flush=True,
    )
    try:
        server.run()  # re-raises SIGINT/SIGTERM after a graceful stop: the CLI says it in one line
    finally:
        app.state.view.close()
    return 0


def _cannot_listen(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (None: it can)."""
    try:
        with socket.create_server((host, port)):
            return None
    except OSError as exc:
        return os.strerror(exc.errno) if exc.errno else str(exc)
