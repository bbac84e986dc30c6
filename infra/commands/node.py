"""`stacx node up --cluster FILE --host NAME [--explain]`: one host's services of a cluster.

FILE is a pipeline file with a `cluster:` section (hosts and their roles). The command starts
exactly the services of host NAME under supervision (what a systemd unit, a Slurm task or a
Kubernetes pod runs per node; see examples/cluster/) and stops them all on SIGINT/SIGTERM.
`--explain` prints that host's plan (services, command lines, config files) and starts nothing.
`stacx node bind` writes a copy of FILE bound to a scheduler's allocation (node i runs host i).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    node = subparsers.add_parser("node", help="run one host's services of a cluster")
    actions = node.add_subparsers(dest="node_command", metavar="ACTION")
    up = actions.add_parser("up", help="start this host's services (cluster.hosts[NAME].roles)")
    up.add_argument("--cluster", required=True, help="pipeline file with a `cluster:` section")
    up.add_argument("--host", required=True, help="this host's name in cluster.hosts")
    up.add_argument("--explain", action="store_true", help="print the host's plan; start nothing")
    up.set_defaults(func=_up)
    hosts = actions.add_parser("hosts", help="the cluster's host names, one a line (with roles)")
    hosts.add_argument("--cluster", required=True, help="pipeline file with a `cluster:` section")
    hosts.add_argument(
        "--index", type=int, help="print only the name of the host at this index (Slurm's SLURM_NODEID)"
    )
    hosts.set_defaults(func=_hosts)
    bind = actions.add_parser(
        "bind", help="write the cluster file bound to an allocation (host i on node i, its address)"
    )
    bind.add_argument("--cluster", required=True, help="pipeline file with a `cluster:` section")
    bind.add_argument("--out", required=True, help="where to write the job's cluster file")
    bind.add_argument("nodes", nargs="+", metavar="NODE=ADDRESS", help="the allocated nodes, in order")
    bind.set_defaults(func=_bind)
    node.set_defaults(func=lambda args: _usage(node))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _hosts(args: argparse.Namespace) -> int:
    from stacx.infra.pipeline import PipelineConfigError, load_spec

    try:
        cluster = load_spec(args.cluster, check=False).cluster
    except PipelineConfigError as exc:
        for line in str(exc).splitlines():
            print(f"stacx node hosts: {line}", file=sys.stderr)
        return 2
    if args.index is not None:
        if not 0 <= args.index < len(cluster.hosts):
            print(
                f"stacx node hosts: --index {args.index}: {args.cluster} has {len(cluster.hosts)} hosts "
                f"(0..{len(cluster.hosts) - 1}); allocate as many nodes as cluster.hosts lists",
                file=sys.stderr,
            )
            return 2
        print(cluster.hosts[args.index].name)
        return 0
    for host in cluster.hosts:
        print(f"{host.name}\t{host.address}\t{','.join(host.roles)}")
    return 0


def _bind(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from stacx.infra.config import ConfigError, load_yaml
    from stacx.infra.pipeline import PipelineConfigError, load_spec
    from stacx.infra.pipeline.allocation import bind_allocation, parse_nodes

    try:
        tree = load_yaml(args.cluster)
        bound = bind_allocation(tree, parse_nodes(args.nodes), source=Path(args.cluster))
        out = Path(args.out)
        out.write_text(yaml.safe_dump(bound, sort_keys=False))
        load_spec(out)  # the job's file is valid as written
    except (ConfigError, PipelineConfigError, OSError) as exc:
        for line in str(exc).splitlines():
            print(f"stacx node bind: {line}", file=sys.stderr)
        return 2
    for (node, address), host in zip(parse_nodes(args.nodes), bound["cluster"]["hosts"], strict=True):
        print(f"{host['name']}\t{node}\t{address}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from stacx.infra.pipeline import PipelineConfigError, PipelineError, load_spec
    from stacx.infra.pipeline.errors import ServiceError
    from stacx.infra.pipeline.layout import RunLayout
    from stacx.infra.pipeline.node import NodeRunner, explain_node

    try:
        spec = load_spec(args.cluster)
        layout = RunLayout.create(spec)
        try:
            spec.cluster.host(args.host)
        except ValueError as exc:
            raise PipelineConfigError(f"{args.cluster}: --host {args.host}: {exc}") from exc
        if args.explain:
            print(explain_node(spec, layout, args.host), end="")
            return 0
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        return NodeRunner(spec, layout, args.host).run()
    except PipelineConfigError as exc:
        for line in str(exc).splitlines():
            print(f"stacx node up: {line}", file=sys.stderr)
        return 2
    except (PipelineError, ServiceError) as exc:
        print(f"stacx node up: {exc}", file=sys.stderr)
        return 1
