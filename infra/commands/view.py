"""`stacx view [--runs-dir DIR] [--port N]`: a local web app of runs, their curves and their
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
from pathlib import Path
from typing import Any

DEFAULT_PORT = 8760


def register(subparsers: Any) -> None:
    from infra.commands.trace import DEFAULT_QUERY_URL
    from schemas.topics import default_bootstrap

    p = subparsers.add_parser(
        "view", help="web view of runs, curves and trajectories on 127.0.0.1 (no external assets)"
    )
    p.add_argument(
        "--runs-dir", type=Path, default=Path("runs"), help="folder of run folders (default: runs)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    p.add_argument(
        "--bootstrap-servers",
        default=default_bootstrap(),
        help="Kafka broker of the runs' topics (default: $STACX_KAFKA, else 127.0.0.1:9092)",
    )
    p.add_argument(
        "--jaeger-url",
        default=os.environ.get("STACX_TRACE_QUERY_URL", DEFAULT_QUERY_URL),
        help=f"trace backend UI for trace links (default: $STACX_TRACE_QUERY_URL, else {DEFAULT_QUERY_URL})",
    )
    p.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    import uvicorn

    from infra.view import ViewConfig, create_app

    if not 0 < args.port < 65536:
        print(f"stacx view: --port {args.port} is not a port (1-65535)", file=sys.stderr)
        return 2
    problem = _cannot_listen(args.host, args.port)
    if problem is not None:
        print(
            f"stacx view: cannot listen on {args.host}:{args.port} ({problem}); pass another --port",
            file=sys.stderr,
        )
        return 2
    app = create_app(
        ViewConfig(
            runs_dir=args.runs_dir, bootstrap_servers=args.bootstrap_servers, jaeger_url=args.jaeger_url
        )
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    )
    print(
        f"stacx view: http://{args.host}:{args.port}/ "
        f"(runs from {args.runs_dir}/ and {args.bootstrap_servers})",
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
