"""Services and rank groups placed by a real 2-node Ray cluster, then the loss of a node.

The bench makes two hosts (network namespaces of `stacx.infra.services.netlab`): `head`
(`ray start --head`, with a custom resource `docker`) and `worker` (`ray start --address`), each
with its own `--temp-dir`, and joins the head's namespace to drive (a Ray driver runs on a node).
`stacx.infra.pipeline.raycluster` then places:

- three HTTP services, each bound to its node's address (`--bind {node_ip}`), their URLs found
  from the actor's node: `anchor` asks for `docker` (the head), `alpha` and `beta` are SPREAD;
- two rank groups on separate placement groups: `policy` (2 ranks, STRICT_SPREAD, a gloo
  all-reduce across the nodes with MASTER_ADDR from bundle 0) and `critic` (1 rank, PACK).

Where each actor runs is read back with Ray's state API. Then every process of the worker host
is killed (SIGKILL); the pipeline's `Supervisor` restarts the lost services, Ray places them on
the head, and `recovery_s` is the time from the kill until every service answers again. Last,
`RayPlacement.close()` removes its actors and placement groups, which the state API confirms,
and the Ray nodes are stopped by pid.

    sudo .venv/bin/python bench/ray_placement.py [--json]

Needs root and iproute2. Last stdout line: the JSON object; exit status 1 when one of its checks
fails (`checks_failed`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx.infra.pipeline.raycluster import RayPlacement, RayPlacementConfig, RayService  # noqa: E402
from stacx.infra.pipeline.services import RestartPolicy, ServiceSpec, Supervisor, http_ready  # noqa: E402
from stacx.infra.services.netlab import NetLab, join_netns, netlab_problem  # noqa: E402

log = logging.getLogger("stacx.bench.ray")
HEAD_PORT = 6379
DASHBOARD_PORT = 8265
ALLREDUCE = (
    "import datetime, os, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=90))\n"
    "t = torch.tensor([float(os.environ['RANK']) + 1.0])\n"
    "dist.all_reduce(t)\n"
    "print('allreduce', t.item(), 'world', dist.get_world_size(), 'master', os.environ['MASTER_ADDR'])\n"
    "dist.destroy_process_group()\n"
)



def start_nodes(lab: NetLab, root: Path, ray_root: Path) -> None:
    """Head and worker, each with its own temp dir under `ray_root` (short: Ray's sockets live
    there, and a socket path has at most 107 bytes)."""
    ray_bin = str(Path(sys.executable).with_name("ray"))
    head, worker = lab.hosts["head"], lab.hosts["worker"]
    common = ["--block", "--disable-usage-stats"]
    # a busy machine delays a live raylet's answers; a dead one refuses at once, so a long check
    # timeout keeps loaded nodes alive and still finds the killed one quickly
    tolerant = {"RAY_health_check_timeout_ms": "30000", "RAY_health_check_failure_threshold": "10"}
    lab.start("head", [ray_bin, "start", "--head", *common, "--node-ip-address", head.address,
                       "--port", str(HEAD_PORT), "--num-cpus", "6", "--resources", '{"docker": 1}',
                       "--dashboard-host", head.address, "--temp-dir", str(ray_root / "head")],
              log_path=root / "head.log", env=tolerant)
    lab.start("worker", [ray_bin, "start", *common, "--address", f"{head.address}:{HEAD_PORT}",
                         "--node-ip-address", worker.address, "--num-cpus", "3",
                         "--temp-dir", str(ray_root / "worker")],
              log_path=root / "worker.log", env=tolerant)


def wait_nodes(count: int, timeout_s: float) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while len([n for n in ray.nodes() if n["Alive"]]) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} Ray nodes alive after {timeout_s:.0f}s")
        time.sleep(0.5)


def actor_nodes(head_ip: str, prefix: str) -> dict[str, str]:
    """Name -> node address of the ALIVE actors whose name starts with `prefix` (Ray's state API)."""
    import ray
    from ray.util.state import list_actors

    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    actors = list_actors(address=f"http://{head_ip}:{DASHBOARD_PORT}", filters=[("state", "=", "ALIVE")],
                         limit=1000, raise_on_missing_output=False)
    return {a.name: ips.get(a.node_id, "?") for a in actors if a.name and a.name.startswith(prefix)}


def leftovers(head_ip: str, prefix: str) -> dict[str, int]:
    """Our actors still alive and our placement groups not removed, after close()."""
    from ray.util.state import list_actors, list_placement_groups

    address = f"http://{head_ip}:{DASHBOARD_PORT}"
    actors = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000,
                         raise_on_missing_output=False)
    groups = list_placement_groups(address=address, limit=1000, raise_on_missing_output=False)
    return {
        "actors": sum(1 for a in actors if (a.name or "").startswith(prefix)),
        "placement_groups": sum(1 for g in groups if g.name.startswith(prefix) and g.state != "REMOVED"),
    }


def http_service(name: str, port: int) -> ServiceSpec:
    return ServiceSpec(name=name, program=[sys.executable, "-m", "http.server"],
                       args=["--bind", "{node_ip}", str(port)], ready_url=f"http://{{node_ip}}:{port}/")


def wait_all_ready(services: list[RayService], supervisor: Supervisor, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        supervisor.poll()
        if all(s.alive() and s.spec.ready_url and http_ready(s.spec.ready_url, 1.0) for s in services):
            return
        time.sleep(0.2)
    raise TimeoutError(f"services not all ready within {timeout_s:.0f}s")


def run_ranks(placement: RayPlacement, name: str, log_dir: Path) -> list[str]:
    spec = ServiceSpec(name=name, program=[sys.executable, "-c", ALLREDUCE], args=[], finishes=True,
                       env={"GLOO_SOCKET_IFNAME": "eth0"})
    ranks = placement.rank_group(name, spec, log_dir)
    for rank in ranks:
        rank.start()
    for rank in ranks:
        assert rank.proc is not None
        status = rank.proc.wait(timeout=180)
        if status != 0:
            raise RuntimeError(f"{rank.spec.name} exited {status}:\n{rank.tail()}")
    lines = [next(line for line in r.tail(50).splitlines() if line.startswith("allreduce")) for r in ranks]
    for rank in ranks:
        rank.stop()  # a finished rank's actor goes
    return lines


def scenario(lab: NetLab, root: Path, ray_root: Path) -> dict[str, Any]:
    head_ip = lab.hosts["head"].address
    worker_ip = lab.hosts["worker"].address
    t0 = time.monotonic()
    start_nodes(lab, root, ray_root)
    join_netns(lab.hosts["head"].netns)
    config = RayPlacementConfig.model_validate({
        "address": f"{head_ip}:{HEAD_PORT}",
        "services": {"anchor": {"resources": {"docker": 1}}, "alpha": {"strategy": "SPREAD"},
                     "beta": {"strategy": "SPREAD"}},
        "groups": {"policy": {"ranks": 2, "strategy": "STRICT_SPREAD"}, "critic": {"ranks": 1}},
    })
    run_id = f"bench{os.getpid()}"
    placement = _connect(lab, config, run_id, timeout_s=120)
    wait_nodes(2, 120)
    cluster_up_s = time.monotonic() - t0
    log_dir = root / "logs"
    supervisor = Supervisor(RestartPolicy(max_restarts=3, backoff_s=0.5))
    services = [placement.service(http_service(n, p), log_dir)
                for n, p in (("anchor", 8801), ("alpha", 8802), ("beta", 8803))]
    try:
        for service in services:
            supervisor.add(service.start())
        wait_all_ready(services, supervisor, 120)
        prefix = f"stacx-{run_id}-"
        placed = actor_nodes(head_ip, prefix)
        policy = run_ranks(placement, "policy", log_dir)
        critic = run_ranks(placement, "critic", log_dir)
        moved = [s.spec.name for s in services if s.node_ip == worker_ip]
        killed = time.monotonic()
        lab.kill_host("worker")
        wait_all_ready(services, supervisor, 240)
        recovery_s = time.monotonic() - killed
        after = actor_nodes(head_ip, prefix)
        urls = {s.spec.name: s.spec.ready_url for s in services}
    finally:
        placement.close()
    time.sleep(2.0)  # the GCS records the removals
    return {
        "bench": "ray_placement",
        "cluster_up_s": round(cluster_up_s, 1),
        "placed": placed,
        "policy_ranks": policy,
        "critic_ranks": critic,
        "on_lost_node": moved,
        "restarts": dict(supervisor.restarts),
        "recovery_s": round(recovery_s, 1),
        "after_loss": after,
        "urls_after_loss": urls,
        "left_after_close": leftovers(head_ip, prefix),
        "head": head_ip,
        "worker": worker_ip,
    }


def _connect(lab: NetLab, config: RayPlacementConfig, run_id: str, timeout_s: float) -> RayPlacement:
    """Connect once the head answers (it starts in a few seconds); fail at once if a node died."""
    deadline = time.monotonic() + timeout_s
    while True:
        for host in lab.hosts.values():
            if any(p.poll() is not None for p in host.processes):
                raise RuntimeError(f"the Ray node on {host.name} exited; see its log")
        try:
            return RayPlacement(config, run_id=run_id)
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


RECOVERY_BOUND_S = 60.0
"""A lost node's services must answer again on a live node within this."""


def failed_checks(result: dict[str, Any]) -> list[str]:
    """The bench's own checks, by name: placement as configured, the lost node's services back on
    the head within the bound, nothing of the run left in Ray."""
    head, worker = result["head"], result["worker"]
    placed = {name.split("-")[2]: ip for name, ip in result["placed"].items()}
    after = {n.split("-")[2]: ip for n, ip in result["after_loss"].items() if n.split("-")[2] in placed}
    checks = {
        "docker_resource": placed.get("anchor") == head,
        "spread": {placed.get("alpha"), placed.get("beta")} == {head, worker},
        "policy_ranks_across_nodes": result["policy_ranks"] == [f"allreduce 3.0 world 2 master {head}"] * 2,
        "lost_node_restarted_once": len(result["on_lost_node"]) == 1
        and result["restarts"].get(result["on_lost_node"][0]) == 1,
        "recovery_within_bound": result["recovery_s"] < RECOVERY_BOUND_S,
        "all_on_the_head_after_loss": set(after.values()) == {head},
        "nothing_left": result["left_after_close"] == {"actors": 0, "placement_groups": 0},
    }
    return [name for name, ok in checks.items() if not ok]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    parser.add_argument("--keep", type=Path, help="write logs here instead of a temporary folder")
    args = parser.parse_args(argv)
    problem = netlab_problem()
    if problem:
        print(json.dumps({"bench": "ray_placement", "skipped": problem}))
        return 2
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO)
    with tempfile.TemporaryDirectory(prefix="sxray", dir="/tmp") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        with NetLab(["head", "worker"]) as lab:
            result = scenario(lab, root, Path(tmp))
    result["checks_failed"] = failed_checks(result)
    print(json.dumps(result))
    return 1 if result["checks_failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
