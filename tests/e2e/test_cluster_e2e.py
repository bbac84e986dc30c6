"""Many hosts, short: `bench/cluster.py --quick` runs the quickstart pipeline over namespaced
hosts (3 brokers, 2 rollout hosts with a gateway and a server each, the assembler, the trainer
over 2 hosts x 1 rank), each host started by `stacx node up`; a broker, a rollout host and a
trainer host are lost mid-run; the audit over the run's topics and checkpoints finds nothing lost,
nothing trained twice and no version regression, and nothing of the run is left running.

Needs root (network namespaces), the Kafka jars of `stacx infra up` and bubblewrap.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.services.netlab import netlab_problem

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netlab_problem() is not None, reason=str(netlab_problem())),
]


@pytest.mark.timeout(2700)
def test_losing_a_broker_a_rollout_host_and_a_trainer_host_loses_nothing(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(REPO / "bench" / "cluster.py"),
        "--json",
        "--quick",
        "--versions",
        "3",
        "--window-s",
        "30",
        "--timeout-s",
        "1500",
        "--keep",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    assert (result["brokers"], result["rollout_hosts"], result["trainer_hosts"]) == (3, 2, 2)
    assert result["topics"] == {"replication_factor": 3, "min_insync_replicas": 2}
    assert result["policy_versions"] >= 3 and result["policy_versions"] > result["version_at_loss"]
    assert result["lost"] == 0, result["lost_examples"]
    assert result["trained_twice"] == 0
    assert result["version_regressions"] == 0
    assert result["trained_batches"] >= 3 and result["orphans"] == 0
