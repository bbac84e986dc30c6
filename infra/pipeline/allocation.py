"""A cluster file bound to a scheduler's allocation (`stacx node bind`): the allocation's nodes
take the file's hosts in order, each host's address becomes its node's, and paths relative to the
file (`pipeline.plugin_paths`) become absolute, so the job's copy works from any folder.

Slurm's `sbatch` script passes `NODE=ADDRESS` pairs from `scontrol show hostnames` and each
node's `NodeAddr` (examples/cluster/sbatch.sh).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacx.infra.pipeline.errors import PipelineConfigError

__all__ = ["bind_allocation", "parse_nodes"]


def parse_nodes(pairs: Sequence[str]) -> list[tuple[str, str]]:
    """`NODE=ADDRESS` arguments as (node, address); one line naming the bad one otherwise."""
    nodes = []
    for pair in pairs:
        node, sep, address = pair.partition("=")
        if not sep or not node or not address:
            raise PipelineConfigError(f"{pair!r}: give each allocated node as NODE=ADDRESS")
        nodes.append((node, address))
    return nodes


def bind_allocation(
    tree: dict[str, Any], nodes: Sequence[tuple[str, str]], *, source: Path
) -> dict[str, Any]:
    """A copy of the cluster file `tree` (read from `source`) whose i-th host runs on the i-th
    allocated node: its address that node's; relative plugin paths made absolute."""
    hosts = list(((tree.get("cluster") or {}).get("hosts")) or [])
    if len(nodes) != len(hosts):
        names = ", ".join(str(h.get("name")) for h in hosts)
        raise PipelineConfigError(
            f"{source}: the allocation has {len(nodes)} node(s), cluster.hosts lists {len(hosts)} "
            f"({names}); allocate as many nodes as hosts (sbatch --nodes={len(hosts)})"
        )
    bound = {**tree, "cluster": {**tree["cluster"], "hosts": [
        {**host, "address": address} for host, (_, address) in zip(hosts, nodes, strict=True)
    ]}}
    pipeline = dict(bound.get("pipeline") or {})
    base = source.resolve().parent
    if pipeline.get("plugin_paths"):
        pipeline["plugin_paths"] = [str((base / p).resolve()) for p in pipeline["plugin_paths"]]
        bound["pipeline"] = pipeline
    return bound
