"""`stacx route --config FILE | --upstream URL ...`: one URL in front of several inference servers."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

log = logging.getLogger("stacx.route")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "route", help="route requests over several inference servers (prefix affinity, failover)"
    )
    p.add_argument("--config", help="YAML file whose `router` section is RouterConfig")
    p.add_argument("--upstream", action="append", help="inference server URL (repeat for several)")
    p.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 30000)")
    p.set_defaults(func=_route)


ROUTE_FLAGS = {"upstream": "upstreams", "host": "host", "port": "port"}
"""Each flag of `stacx route` and the field of the `router:` section it overrides."""


def _route(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per forwarded call otherwise
    from stacx.infra.config import ConfigError, section_with_overrides
    from stacx.rollout.inference import InferenceError
    from stacx.rollout.inference.router import RouterConfig
    from stacx.rollout.inference.router_app import RouterServer

    try:
        config = section_with_overrides(args, "router", RouterConfig, ROUTE_FLAGS)
        server = RouterServer(config)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"stacx route: {line}", file=sys.stderr)
        return 2
    except InferenceError as exc:
        print(f"stacx route: {exc}", file=sys.stderr)
        return 2
    server.serve_forever()
    return 0
