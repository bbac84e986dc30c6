"""`stacx route --config FILE | --upstream URL ...`: one URL in front of several inference servers."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from typing import Any

log = logging.getLogger("stacx.route")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "route", help="sglang-router over several inference servers (prefix affinity, failover)"
    )
    p.add_argument("--config", help="YAML file whose `router` section is RouterConfig")
    p.add_argument("--upstream", action="append", help="inference server URL (repeat for several)")
    p.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 30000)")
    p.set_defaults(func=_route)


ROUTE_FLAGS = {"upstream": "upstreams", "host": "host", "port": "port"}
"""Each flag of `stacx route` and the field of the `router:` section it overrides."""


def _route(args: argparse.Namespace) -> int:
    """Validate the section, then become `sglang-router` (exec: its pid is this service's pid, so
    supervision stops and restarts the router itself)."""
    from stacx.infra.config import ConfigError, section_with_overrides
    from stacx.rollout.inference.router import RouterConfig, router_command

    try:
        config = section_with_overrides(args, "router", RouterConfig, ROUTE_FLAGS)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"stacx route: {line}", file=sys.stderr)
        return 2
    if not config.upstreams:
        print("stacx route: router.upstreams is empty; name at least one inference server URL "
              "(--upstream URL, repeatable)", file=sys.stderr)
        return 2
    if importlib.util.find_spec("sglang_router") is None:
        print("stacx route: the sglang-router package is not installed in this environment; "
              "run `make setup` (it is a dependency of stacx)", file=sys.stderr)
        return 2
    command = router_command(config)
    log.info("routing %s through sglang-router on %s:%d", config.upstreams, config.host, config.port)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
