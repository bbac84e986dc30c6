"""Three KRaft brokers on three namespaced hosts, each started by `stacx node up --host kafka-N`
from one cluster file: the run's topics get replication 3 and min.insync.replicas 2 from the topic
policy; a host is lost (every process of it killed) while a client host writes with the
producers' acks=all settings; writes go on and every record is read back.

Needs root (network namespaces) and the Kafka jars `stacx infra up` installed; the shared local
broker is not touched (the brokers listen on the lab's addresses only, with their own STACX_HOME).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacx.infra.services import kafka
from stacx.infra.services.netlab import NetLab, lab_home, netlab_problem

REPO = Path(__file__).resolve().parents[3]
CLIENT = REPO / "bench" / "cluster_client.py"
BROKERS = ("kafka-1", "kafka-2", "kafka-3")


@pytest.fixture(autouse=True)
def _a_lab_can_run() -> None:
    """The lab needs root and `ip` (installed by `stacx infra up`); without them this fails, it
    does not skip."""
    problem = netlab_problem()
    assert problem is None, f"cannot build the network-namespace hosts: {problem}"


def cluster_tree(lab: NetLab, runs_dir: Path, run_id: str) -> dict[str, Any]:
    tree = copy.deepcopy(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()))
    tree.pop("bootstrap_servers", None)
    tree["pipeline"]["plugin_paths"] = [str(REPO / "examples")]
    tree["pipeline"]["runs_dir"] = str(runs_dir)
    tree["pipeline"]["name"] = run_id
    hosts = [{"name": b, "address": lab.hosts[b].address, "roles": ["broker"]} for b in BROKERS]
    work = ["gateway", "inference", "rollout", "assembler", "trainer"]
    hosts.append({"name": "client", "address": lab.hosts["client"].address, "roles": work})
    tree["cluster"] = {"run_id": run_id, "broker_heap": "384m", "setup_timeout_s": 300, "hosts": hosts}
    return tree


def client(lab: NetLab, cluster_file: Path, *args: str, timeout_s: float = 300) -> dict[str, Any]:
    done = lab.run("client", [sys.executable, str(CLIENT), str(cluster_file), *args], timeout_s=timeout_s)
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_losing_one_of_three_brokers_loses_no_acknowledged_write(tmp_path: Path) -> None:
    assert (kafka.jar_dir() / ".complete").exists(), "no Kafka jars: run `stacx infra up` once"
    run_id = f"lab-{tmp_path.name[-12:].replace('_', '-')}"
    with NetLab([*BROKERS, "client"]) as lab:
        cluster_file = tmp_path / "cluster.yaml"
        cluster_file.write_text(yaml.safe_dump(cluster_tree(lab, tmp_path / "runs", run_id)))
        env = {"STACX_HOME": str(lab_home(tmp_path))}
        for name in BROKERS:
            argv = [
                str(Path(sys.executable).with_name("stacx")),
                "node",
                "up",
                "--cluster",
                str(cluster_file),
                "--host",
                name,
            ]
            lab.start(name, argv, log_path=tmp_path / f"{name}.log", env=env, cwd=tmp_path)
        ready = client(lab, cluster_file, "wait", "3", "300", timeout_s=400)
        assert ready["brokers"] == 3, (tmp_path / "kafka-1.log").read_text()[-3000:]
        topics = client(lab, cluster_file, "create")["topics"]
        trajectories = next(t for t in topics if t.startswith("stacx.trajectories."))
        before = client(lab, cluster_file, "describe", trajectories)
        assert before["brokers"] == [1, 2, 3]
        assert before["min_insync_replicas"] == 2
        assert all(
            p["replicas"] == [1, 2, 3] and p["isr"] == [1, 2, 3] for p in before["partitions"].values()
        )

        first = client(lab, cluster_file, "produce", trajectories, "0", "300")
        assert (first["acks"], first["failed"]) == ("all", 0), first
        lab.kill_host("kafka-3")
        second = client(lab, cluster_file, "produce", trajectories, "300", "300")
        assert second["failed"] == 0, second  # two in-sync replicas left: acks=all writes go on

        after = client(lab, cluster_file, "describe", trajectories)
        assert after["brokers"] == [1, 2]
        assert all(p["isr"] == [1, 2] for p in after["partitions"].values()), after
        read = client(lab, cluster_file, "keys", trajectories)
        assert read["distinct"] == 600 and read["unread_partitions"] == [], read
        for name in BROKERS[:2]:
            proc = lab.hosts[name].processes[0]
            assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
