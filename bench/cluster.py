"""Many hosts on one machine: the quickstart pipeline over namespaced hosts, each started by
`stacx node up --cluster FILE --host NAME`, then the loss of a broker, a rollout host and a
trainer host mid-run, and the audit of bench/chaos.py over the run's topics and checkpoints.

Hosts (network namespaces of `stacx.infra.services.netlab`, each with its own address on a bridge the
bench creates; nothing reaches any other address): kafka-1..3 (one KRaft cluster; the topic
policy gives replication 3 and min.insync.replicas 2), roll-1 and roll-2 (gateway, inference
server, rollout worker each; the workers share the run's tasks topic as one consumer group),
train-1 (assembler, trainer rank 0) and train-2 (trainer rank 1; the ranks meet through torchrun's
c10d rendezvous, gloo over the lab's network), and `control`, where this script itself runs its
Kafka reads (it joins that namespace after building the lab).

Scale-out: roll-2's node starts `--window-s` after roll-1's workers produce their first
trajectory; once its services are up (and 30 s more), `trajectories_per_s` is measured over a
window with two rollout hosts, beside the window with one, on the same task stream. Then
kafka-3, roll-2 and train-2 are lost (every process of the host killed with SIGKILL); the trainer
host comes back (its node restarted, as systemd or a Slurm requeue would) since a
torch.distributed group cannot lose a rank and go on; the run trains `--versions` more policy
versions, every node is stopped and the audit reads everything back.

    sudo .venv/bin/python bench/cluster.py --json [--versions 6] [--window-s 60] \
        [--tool-latency-s 2 --sft-steps 900]

`--tool-latency-s` (default 2 s) adds a sleep to every tool call (the sandbox is held, the CPU is
not), so a rollout host is bound by tool latency as with remote tools or slow test suites; the SFT
warm start (`--sft-steps`, default 900) teaches the tiny model to call the tool
(`tool_calls_per_trajectory`). `--tool-latency-s 0 --sft-steps 0` is the CPU-bound case.

Needs root (namespaces), the Kafka jars `stacx infra up` installed and bubblewrap (the gateways'
process backend). Last stdout line: the JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx.infra.pipeline import load_spec  # noqa: E402
from stacx.infra.pipeline.layout import RunLayout  # noqa: E402
from stacx.infra.services import kafka  # noqa: E402
from stacx.infra.services.netlab import NetLab, lab_home, netlab_problem, stop_group  # noqa: E402

log = logging.getLogger("stacx.cluster")

REPO = Path(__file__).resolve().parents[1]
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
ROLLOUTS = ("roll-1", "roll-2")
TRAINERS = ("train-1", "train-2")
CLONE_NEWNET = 0x40000000


def tool_python(latency_s: float) -> str:
    """The ReTool scaffold's interpreter command, `latency_s` slower per tool call (a remote
    tool, a slow test suite): the sleep holds a sandbox, not a CPU."""
    if latency_s <= 0:
        return "python3"
    code = f"import sys,time;time.sleep({latency_s!r});exec(compile(sys.stdin.read(),'<tool>','exec'))"
    return f'python3 -c "{code}"'


def cluster_tree(
    lab: NetLab,
    runs_dir: Path,
    run_id: str,
    *,
    quick: bool,
    tool_latency_s: float = 0.0,
    sft_steps: int = 0,
) -> dict[str, Any]:
    """The quickstart as a cluster file over the lab's hosts, small enough for two cores."""
    tree: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    tree.pop("bootstrap_servers", None)
    cfg = tree["pipeline"]
    cfg.update(name=run_id, runs_dir=str(runs_dir), plugin_paths=[str(REPO / "examples")], live=False)
    if sft_steps:  # a short warm start teaches the tool-call format (tool latency then applies)
        cfg["sft"].update(steps=sft_steps, skill_steps=int(sft_steps * 0.9), batch_size=16)
    else:
        cfg.pop("sft", None)  # plumbing under fire, not learning: no warm start
    cfg["evaluation"] = {"every_versions": 0, "final_samples_per_problem": 0}
    cfg["tasks"]["options"].update(num_train=256, num_heldout=8)
    cfg["steps"] = 1000
    tree["gateway"] = {"backend": "process", "port": 8710}
    tree["inference"]["server"]["engine"] = {"max_batch_size": 16}
    tree["rollout"]["data"]["samples_per_task"] = 4
    manager = tree["rollout"]["manager"]
    for evaluator in manager["evaluators"].values():
        evaluator.setdefault("scaffold_options", {})["python"] = tool_python(tool_latency_s)
    manager.update(max_concurrent_episodes=8 if quick else 16, train_groups_per_version=2)
    manager["pool"].update(sandboxes=8 if quick else 16, generations=16)
    tree["assembler"]["grouping"]["group_size"] = 4
    tree["assembler"]["mixture"]["batch_size"] = 2
    tree["trainer"]["checkpoint"] = {"every_steps": 1}
    tree["trainer"].pop("backend", None)
    tree["trainer"]["backend"] = {"device": "cpu"}
    hosts = [{"name": b, "address": lab.hosts[b].address, "roles": ["broker"]} for b in BROKERS]
    hosts += [
        {"name": r, "address": lab.hosts[r].address, "roles": ["gateway", "inference", "rollout"]}
        for r in ROLLOUTS
    ]
    hosts.append(
        {
            "name": "train-1",
            "address": lab.hosts["train-1"].address,
            "roles": ["assembler", "trainer"],
            "interface": "eth0",
        }
    )
    hosts.append(
        {
            "name": "train-2",
            "address": lab.hosts["train-2"].address,
            "roles": ["trainer"],
            "interface": "eth0",
        }
    )
    tree["cluster"] = {"run_id": run_id, "broker_heap": "384m", "setup_timeout_s": 900, "hosts": hosts}
    return tree


def join_netns(netns: str) -> None:
    """This thread (and every thread and process it starts from now on) joins `netns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)


class Cluster:
    """The lab's nodes: start, lose, restart, stop."""

    def __init__(self, lab: NetLab, cluster_file: Path, root: Path, env: dict[str, str]) -> None:
        self.lab, self.file, self.root, self.env = lab, cluster_file, root, env
        self.stacx = str(Path(sys.executable).with_name("stacx"))

    def up(self, host: str) -> None:
        argv = [self.stacx, "node", "up", "--cluster", str(self.file), "--host", host]
        self.lab.start(host, argv, log_path=self.root / "nodes" / f"{host}.log", env=self.env, cwd=self.root)

    def running(self, host: str) -> bool:
        """Every service of `host` started and ready (its node's log says so)."""
        log_path = self.root / "nodes" / f"{host}.log"
        return log_path.exists() and f"node {host}: running " in log_path.read_text(errors="replace")

    def lose(self, host: str) -> None:
        log.warning("cluster: host %s lost (every process killed)", host)
        self.lab.kill_host(host)


class Watch:
    """Counts of the run's topics, read from the control namespace."""

    def __init__(self, bootstrap: str, layout: RunLayout) -> None:
        from confluent_kafka import Consumer

        self.layout = layout
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"stacx-cluster-watch-{os.getpid()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 0,
            }
        )
        self.trajectories: list[float] = []
        self.tool_calls: list[int] = []
        """Tool turns of each trajectory (the tool latency applies to each)."""
        self.versions = 0

    def start(self) -> Watch:
        self.consumer.subscribe([self.layout.topics.trajectories, self.layout.topics.weights])
        return self

    def poll(self, seconds: float) -> None:
        from stacx.schemas.codec import decode
        from stacx.schemas.records import WeightVersion

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            if msg.topic() == self.layout.topics.trajectories:
                self.trajectories.append(time.monotonic())
                self.tool_calls.append(_tool_turns(msg.value()))
            elif msg.value():
                with contextlib.suppress(Exception):
                    v = decode(msg.value(), WeightVersion)
                    if v.model_name == self.layout.model_name:
                        self.versions = max(self.versions, v.version)

    def rate(self, start: float, end: float) -> float:
        n = sum(1 for t in self.trajectories if start <= t < end)
        return round(n / max(1e-9, end - start), 3)

    def tool_calls_per_trajectory(self, start: float, end: float) -> float | None:
        calls = [c for t, c in zip(self.trajectories, self.tool_calls, strict=True) if start <= t < end]
        return round(sum(calls) / len(calls), 3) if calls else None

    def wait(self, until: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not until():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout_s:.0f}s")
            self.poll(2.0)


def _tool_turns(payload: bytes) -> int:
    from stacx.consumers.assembly.claims import decode_trajectory

    try:
        return sum(1 for turn in decode_trajectory(payload).turns if turn.role == "tool")
    except Exception:  # the count is a description of the load, never a reason to stop
        return 0


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=6, help="policy versions to train after the losses")
    parser.add_argument("--window-s", type=float, default=60.0, help="each scale-out window")
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--quick", action="store_true", help="smaller pools (the e2e test)")
    parser.add_argument(
        "--tool-latency-s",
        type=float,
        default=2.0,
        help="seconds added to every tool call, so that a host is bound by tool latency, not CPU "
        "(0: none, the hosts are then bound by CPU)",
    )
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=900,
        help="SFT warm start steps (0: none); it teaches tool calls, so the tool latency applies",
    )
    parser.add_argument("--keep", help="keep the run's files in this folder")
    parser.add_argument("--json", action="store_true", help="print the JSON line only")
    return parser.parse_args()


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the lab's `with` stops its processes and deletes its namespaces


def main() -> int:
    args = _args()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    logging.basicConfig(
        level=logging.WARNING if args.json else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    problem = netlab_problem() or (
        None if (kafka.jar_dir() / ".complete").exists() else "no Kafka jars: run `stacx infra up` once"
    )
    if problem:
        print(json.dumps({"error": problem}))
        return 2
    with contextlib.ExitStack() as stack:
        root = (
            Path(args.keep)
            if args.keep
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stacx-cluster-")))
        )
        root.mkdir(parents=True, exist_ok=True)  # --keep may name a folder not made yet
        lab = stack.enter_context(NetLab([*BROKERS, *ROLLOUTS, *TRAINERS, "control"]))
        try:
            result = run(args, lab, root)
        except KeyboardInterrupt:
            print(
                "bench/cluster.py: stopped; the lab's processes and namespaces are removed", file=sys.stderr
            )
            return 130
    print(json.dumps(result))
    return 0


def run(args: argparse.Namespace, lab: NetLab, root: Path) -> dict[str, Any]:
    from stacx.infra.pipeline.orchestrator import Pipeline

    chaos = _chaos_module()  # the soak's audit: lost, trained twice, version regressions

    run_id = f"cluster-{lab.prefix}"
    cluster_file = root / "cluster.yaml"
    tree = cluster_tree(
        lab,
        root / "runs",
        run_id,
        quick=args.quick,
        tool_latency_s=args.tool_latency_s,
        sft_steps=args.sft_steps,
    )
    cluster_file.write_text(yaml.safe_dump(tree))
    spec = load_spec(cluster_file)
    layout = RunLayout.create(spec)
    nodes = Cluster(lab, cluster_file, root, {"STACX_HOME": str(lab_home(root)), "STACX_RUN_ID": run_id})
    join_netns(lab.hosts["control"].netns)
    started = time.monotonic()
    for host in (*BROKERS, "train-1", "train-2", "roll-1"):
        nodes.up(host)
    watch = Watch(spec.bootstrap_servers, layout)
    result: dict[str, Any] = {
        "brokers": len(BROKERS),
        "rollout_hosts": len(ROLLOUTS),
        "trainer_hosts": len(TRAINERS),
        "run_id": run_id,
        "tool_latency_s": args.tool_latency_s,
        "topics": {
            "replication_factor": spec.topics.replication_factor,
            "min_insync_replicas": spec.topics.min_insync_replicas,
        },
    }
    try:
        _await_topics(spec, layout, args.timeout_s)
        watch.start()
        watch.wait(lambda: bool(watch.trajectories), args.timeout_s, "a first trajectory from roll-1")
        one_start = time.monotonic()
        watch.poll(args.window_s)
        one_end = time.monotonic()
        nodes.up("roll-2")
        watch.wait(lambda: nodes.running("roll-2"), args.timeout_s, "roll-2's services up")
        watch.poll(30.0)  # roll-2's worker assigned partitions of the tasks and under way
        two_start = time.monotonic()
        watch.poll(args.window_s)
        two_end = time.monotonic()
        one, two = watch.rate(one_start, one_end), watch.rate(two_start, two_end)
        result["trajectories_per_s"] = {"1": one, "2": two}
        result["rollout_scale_out"] = round(two / one, 3) if one else None
        result["tool_calls_per_trajectory"] = {
            "1": watch.tool_calls_per_trajectory(one_start, one_end),
            "2": watch.tool_calls_per_trajectory(two_start, two_end),
        }
        before = watch.versions
        watch.wait(lambda: watch.versions >= max(1, before), args.timeout_s, "a first policy version")
        for host in ("kafka-3", "roll-2", "train-2"):
            nodes.lose(host)
        result["lost_hosts"] = ["kafka-3", "roll-2", "train-2"]
        result["version_at_loss"] = watch.versions
        nodes.up("train-2")  # the trainer host comes back (systemd Restart=, a Slurm requeue)
        target = result["version_at_loss"] + args.versions
        watch.wait(
            lambda: watch.versions >= target, args.timeout_s, f"{args.versions} versions after the losses"
        )
    except TimeoutError as exc:
        result["error"] = str(exc)
    finally:
        result["policy_versions"] = watch.versions
        if "version_at_loss" in result:
            result["versions_after_losses"] = watch.versions - result["version_at_loss"]
        result["wall_s"] = round(time.monotonic() - started, 1)
    for name, lab_host in lab.hosts.items():  # every node but the brokers stopped (SIGTERM)
        for proc in lab_host.processes if name not in BROKERS else []:
            stop_group(proc)
    pipeline = Pipeline(spec, layout=layout)
    result.update(chaos.audit(pipeline))  # read from the brokers left
    for name in BROKERS:
        for proc in lab.hosts[name].processes:
            stop_group(proc)
    result["orphans"] = len(chaos.orphans(run_id))
    result["staleness_rebases"] = _rebases(layout.logs_dir)
    return result


def _rebases(logs_dir: Path) -> dict[str, int]:
    """Per rollout log, the times its worker counted the staleness bound afresh (its log lines)."""
    return {
        str(path.relative_to(logs_dir)): path.read_text(errors="replace").count("staleness bound rebased")
        for path in sorted(logs_dir.glob("*/rollout*.log"))
    }


def _chaos_module() -> Any:
    """bench/chaos.py, by path (bench/ is not a package; on sys.path its rollout.py would hide
    the rollout package)."""
    import importlib.util

    found = importlib.util.spec_from_file_location("stacx_bench_chaos", Path(__file__).with_name("chaos.py"))
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def _await_topics(spec: Any, layout: RunLayout, timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": spec.bootstrap_servers, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if layout.topics.tasks in admin.list_topics(timeout=5).topics:
                return
        time.sleep(2.0)
    raise TimeoutError(f"the run's topics (set up by train-1) within {timeout_s:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
