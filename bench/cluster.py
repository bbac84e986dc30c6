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
trajectory; once its services are up (and 30 s more), the trajectories generated and trained per
second (`trained_per_s`: those of the batches a new weight version was trained on) are measured
over a window with two rollout hosts, beside the window with one; `rollout_scale_out` is the
ratio of the trained rates. Then kafka-3, roll-2 and train-2 are lost (every process of the host
killed with SIGKILL); the trainer host comes back (its node restarted, as systemd or a Slurm
requeue would) since a torch.distributed group cannot lose a rank and go on. kafka-3 and roll-2
come back, and the three are lost once more by a partition: their links cut for `--partition-s`
(the processes live on, peers hear nothing; the trainer's gloo timeout is 30 s), then healed.
After each loss the new versions within `--recovery-s` are counted (`losses`); every node is
stopped and the audit reads everything back (`duplicate_slots`: sample slots generated twice).
The exit status is 1 when a check fails (`checks_failed`: scale-out below `--min-scale-out`,
fewer than `--versions` versions within `--recovery-s` of a loss, anything lost, trained twice,
a version regression, an orphan process).

    sudo .venv/bin/python bench/cluster.py --json [--versions 5] [--window-s 60] \
        [--tool-latency-s 2 --sft-steps 900] [--no-partition]

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
from stacx.infra.services.netlab import NetLab, join_netns, lab_home, netlab_problem, stop_groups  # noqa: E402

log = logging.getLogger("stacx.cluster")

REPO = Path(__file__).resolve().parents[1]
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
ROLLOUTS = ("roll-1", "roll-2")
TRAINERS = ("train-1", "train-2")
LOST = ("kafka-3", "roll-2", "train-2")
"""A broker, a rollout host and a trainer host: lost by SIGKILL, then once more by a partition."""
PROCESS_GROUP_TIMEOUT_S = 30.0
"""The trainer's gloo timeout here: a partitioned peer fails a collective after this long."""


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
    tree["trainer"]["backend"] = {"device": "cpu", "process_group_timeout_s": PROCESS_GROUP_TIMEOUT_S}
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



class Cluster:
    """The lab's nodes: start, lose, restart, stop."""

    def __init__(self, lab: NetLab, cluster_file: Path, root: Path, env: dict[str, str]) -> None:
        self.lab, self.file, self.root, self.env = lab, cluster_file, root, env
        self.stacx = str(Path(sys.executable).with_name("stacx"))

    def up(self, host: str) -> None:
        argv = [self.stacx, "node", "up", "--cluster", str(self.file), "--host", host]
        self.lab.start(host, argv, log_path=self.root / "nodes" / f"{host}.log", env=self.env, cwd=self.root)

    def running(self, host: str, *, again: bool = False) -> bool:
        """Every service of `host` started and ready (its node's log says so; `again`: its
        restarted node's too, the log holding one such line per start)."""
        log_path = self.root / "nodes" / f"{host}.log"
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        return text.count(f"node {host}: running ") >= (2 if again else 1)

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
        self.version_times: list[float] = []
        """When each new highest version arrived."""
        self.batch_sizes: dict[str, int] = {}
        """Batch id -> its trajectories (from the batches topic)."""
        self.trained: dict[str, float] = {}
        """Batch id -> when the first weight version trained on it was announced."""

    def start(self) -> Watch:
        topics = self.layout.topics
        self.consumer.subscribe([topics.trajectories, topics.weights, topics.batches])
        return self

    def poll(self, seconds: float) -> None:
        from stacx.schemas.codec import decode
        from stacx.schemas.records import TrainingBatch, WeightVersion

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            if msg.topic() == self.layout.topics.trajectories:
                self.trajectories.append(time.monotonic())
                self.tool_calls.append(_tool_turns(msg.value()))
            elif msg.topic() == self.layout.topics.batches:
                with contextlib.suppress(Exception):
                    batch = decode(msg.value(), TrainingBatch)
                    self.batch_sizes[batch.batch_id] = batch.num_sequences
            elif msg.value():
                with contextlib.suppress(Exception):
                    self._version(decode(msg.value(), WeightVersion))

    def _version(self, v: Any) -> None:
        if v.model_name != self.layout.model_name:
            return
        if v.version > self.versions:
            self.versions = v.version
            self.version_times.append(time.monotonic())
        batch_id = v.metadata.get("batch_id")
        if batch_id:
            self.trained.setdefault(batch_id, time.monotonic())

    def rate(self, start: float, end: float) -> float:
        """Trajectories generated per second in [start, end)."""
        n = sum(1 for t in self.trajectories if start <= t < end)
        return round(n / max(1e-9, end - start), 3)

    def trained_rate(self, start: float, end: float) -> float:
        """Trajectories trained per second in [start, end): those of the batches whose weight
        version was announced then (a batch trained twice counts once)."""
        n = sum(self.batch_sizes.get(bid, 0) for bid, t in self.trained.items() if start <= t < end)
        return round(n / max(1e-9, end - start), 3)

    def first_version_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first new version after it (None: none yet)."""
        later = [t for t in self.version_times if t > moment]
        return round(later[0] - moment, 1) if later else None

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
    parser.add_argument(
        "--versions", type=int, default=5, help="policy versions wanted within --recovery-s of each loss"
    )
    parser.add_argument("--recovery-s", type=float, default=300.0, help="the bound after each loss")
    parser.add_argument(
        "--partition-s", type=float, default=45.0, help="how long the partition round cuts the hosts off"
    )
    parser.add_argument("--no-partition", action="store_true", help="SIGKILL losses only")
    parser.add_argument(
        "--min-scale-out", type=float, default=1.7, help="rollout_scale_out (trained) the check wants"
    )
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
    result["checks_failed"] = failed_checks(result, args)
    print(json.dumps(result))
    return 1 if result["checks_failed"] else 0


def failed_checks(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """One line per check of the run that failed (none: exit 0)."""
    failed = [result["error"]] if "error" in result else []
    scale = result.get("rollout_scale_out")
    if scale is None or scale < args.min_scale_out:
        failed.append(f"rollout_scale_out {scale} (trained trajectories) < {args.min_scale_out}")
    for kind, loss in result.get("losses", {}).items():
        if loss.get("versions_within_recovery", 0) < args.versions:
            failed.append(
                f"{kind}: {loss.get('versions_within_recovery', 0)} new versions within "
                f"{args.recovery_s:.0f}s of the loss; want >= {args.versions}"
            )
    for key in ("lost", "trained_twice", "version_regressions", "orphans"):
        if result.get(key) != 0:
            failed.append(f"{key} = {result.get(key)}; want 0")
    return failed


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
    windows: tuple[tuple[float, float], ...] = ()
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
        result["generated_scale_out"] = round(two / one, 3) if one else None
        result["tool_calls_per_trajectory"] = {
            "1": watch.tool_calls_per_trajectory(one_start, one_end),
            "2": watch.tool_calls_per_trajectory(two_start, two_end),
        }
        before = watch.versions
        watch.wait(lambda: watch.versions >= max(1, before), args.timeout_s, "a first policy version")
        windows = ((one_start, one_end), (two_start, two_end))
        result["losses"] = {"sigkill": lose_and_recover(lab, nodes, watch, args, partition=False)}
        result["lost_hosts"] = list(LOST)
        result["version_at_loss"] = result["losses"]["sigkill"]["version_at_loss"]
        if not args.no_partition:
            for host in ("kafka-3", "roll-2"):  # back before the next loss (train-2 came back already)
                nodes.up(host)
            watch.wait(lambda: nodes.running("roll-2", again=True), args.timeout_s, "roll-2 back up")
            result["losses"]["partition"] = lose_and_recover(lab, nodes, watch, args, partition=True)
    except TimeoutError as exc:
        result["error"] = str(exc)
    finally:
        result["policy_versions"] = watch.versions
        if "version_at_loss" in result:
            result["versions_after_losses"] = watch.versions - result["version_at_loss"]
        if windows:
            trained = [watch.trained_rate(*window) for window in windows]
            result["trained_per_s"] = {"1": trained[0], "2": trained[1]}
            result["rollout_scale_out"] = round(trained[1] / trained[0], 3) if trained[0] else None
        result["wall_s"] = round(time.monotonic() - started, 1)
    stopping = time.monotonic()  # every node but the brokers stopped at once (SIGTERM)
    stop_groups([proc for name, host in lab.hosts.items() if name not in BROKERS for proc in host.processes])
    result["nodes_stop_s"] = round(time.monotonic() - stopping, 1)
    pipeline = Pipeline(spec, layout=layout)
    result.update(chaos.audit(pipeline))  # read from the brokers left
    stop_groups([proc for name in BROKERS for proc in lab.hosts[name].processes])
    result["orphans"] = len(chaos.orphans(run_id))
    result["staleness_rebases"] = _rebases(layout.logs_dir)
    return result


def lose_and_recover(
    lab: NetLab, nodes: Cluster, watch: Watch, args: argparse.Namespace, *, partition: bool
) -> dict[str, Any]:
    """Lose kafka-3, roll-2 and train-2 at once (SIGKILL, or a partition healed after
    `--partition-s`), then count the new versions within `--recovery-s` of the loss."""
    at_loss = watch.versions
    for host in LOST:
        if partition:
            lab.cut(host)
        else:
            nodes.lose(host)
    lost_at = time.monotonic()
    if partition:
        log.warning("cluster: %s cut off for %.0f s", ", ".join(LOST), args.partition_s)
        watch.poll(args.partition_s)
        for host in LOST:
            lab.heal(host)
    else:
        nodes.up("train-2")  # the trainer host comes back (systemd Restart=, a Slurm requeue)
    target = at_loss + args.versions
    deadline = lost_at + args.recovery_s
    while watch.versions < target and time.monotonic() < deadline:
        watch.poll(2.0)
    return {
        "version_at_loss": at_loss,
        "versions_within_recovery": watch.versions - at_loss,
        "first_version_s": watch.first_version_after(lost_at),
        "all_versions_s": round(time.monotonic() - lost_at, 1) if watch.versions >= target else None,
        **({"partition_s": args.partition_s} if partition else {}),
    }


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
