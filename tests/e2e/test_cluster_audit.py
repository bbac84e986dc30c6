"""Many hosts, short: `bench/cluster.py --quick` runs the quickstart over namespaced hosts (3
KRaft brokers, 2 rollout hosts with a gateway and a server each, the assembler and trainer rank 0,
trainer rank 1), loses a broker, a rollout host and a trainer host mid-run, brings the trainer
host back, and audits the run's topics, the assembler's state, the trainer's lineage and every
host's logs.

Asserts what the cluster promises, after a loss by SIGKILL and once more by a partition: nothing
lost, nothing trained twice, no version regression, and at least 5 new policy versions within
300 s of each loss (the surviving rollout worker takes over the lost one's tasks; a partitioned
trainer peer fails its collectives within the gloo timeout). The benchmark's own checks decide
its exit status. Throughput (`rollout_scale_out`) is the benchmark's figure (bench/RESULTS.md):
this short CPU-bound run does not assert it.

Needs root (network namespaces), `ip` and bubblewrap, and the Kafka jars `stacx infra up`
installed; without them it fails, it does not skip. The shared local broker is not touched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from process_checks import run_to_the_end

from stacx.infra.services import kafka
from stacx.infra.services.netlab import netlab_problem

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 2400


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 400)
def test_losing_a_broker_a_rollout_host_and_a_trainer_host_loses_nothing_and_stalls_nothing(
    tmp_path: Path,
) -> None:
    problem = netlab_problem()
    assert problem is None, f"cannot build the network-namespace hosts: {problem}"
    assert (kafka.jar_dir() / ".complete").exists(), "no Kafka jars: run `stacx infra up` once"
    cmd = [sys.executable, str(REPO / "bench" / "cluster.py"), "--json", "--quick", "--versions", "5",
           "--recovery-s", "300", "--window-s", "20", "--timeout-s", "600", "--tool-latency-s", "0",
           "--sft-steps", "0", "--min-scale-out", "0", "--keep", str(tmp_path / "run")]
    out = run_to_the_end(cmd, cwd=tmp_path, timeout_s=RUN_TIMEOUT_S, what="bench/cluster.py")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    shown = json.dumps(result, indent=1)  # the whole audit when an assertion fails
    assert "error" not in result, shown  # every wait met, the versions after the losses included
    assert (result["brokers"], result["rollout_hosts"], result["trainer_hosts"]) == (3, 2, 2), shown
    assert result["topics"] == {"replication_factor": 3, "min_insync_replicas": 2}, shown
    assert result["lost_hosts"] == ["kafka-3", "roll-2", "train-2"], shown
    assert result["checks_failed"] == [], shown
    for kind in ("sigkill", "partition"):
        assert result["losses"][kind]["versions_within_recovery"] >= 5, (kind, shown)
    assert "duplicate_slots" in result, shown  # reported (goal 0)
    assert result["policy_versions"] >= 3 and result["trained_batches"] >= 3, shown
    for key in ("lost", "trained_twice", "version_regressions", "trainer_dead_letters",
                "served_regressions", "served_unannounced", "orphans"):
        assert result[key] == 0, (key, shown)
    assert result["server_loads"] >= 2, shown  # read from every rollout host's inference log
    # every host's server follows the weights (a group of its own: hosts on one port never share it)
    served = result["served_last_by_log"]
    assert served["roll-1/inference.log"] >= result["version_at_loss"], shown
    assert served["roll-2/inference.log"] >= 1, shown  # ready (it waits for the newest version) and serving
    assert result["tool_calls_per_trajectory"]["2"] is not None, shown  # both hosts' window had work
