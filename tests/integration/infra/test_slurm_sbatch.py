"""examples/cluster/sbatch.sh on a real Slurm (Debian's slurm-wlm and munge): a controller and two
slurmd nodes, each a network-namespace host. The job binds the cluster file to its allocation
(`scontrol show hostnames`, each node's NodeAddr), asks for CPUs and memory per node, runs one
`stacx node up` per node (a broker, gateway, server and rollout worker on one; the assembler and
the trainer on the other), trains to `pipeline.steps`, and ends: the job is COMPLETED.

Needs root, `ip`, bubblewrap, the Kafka jars and Slurm (`stacx infra up` installs them); without
them it fails, it does not skip. The machine's own munge, Slurm and broker are not touched.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacx.infra.services import kafka
from stacx.infra.services.netlab import NetLab, lab_home, netlab_problem
from stacx.infra.services.slurmlab import SlurmLab, slurm_problem

REPO = Path(__file__).resolve().parents[3]
STEPS = 2
JOB_TIMEOUT_S = 900
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


def cluster_file(root: Path, run_id: str) -> dict[str, Any]:
    """The quickstart on two hosts, small: no SFT, no evaluation, `STEPS` policy versions."""
    tree = copy.deepcopy(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text()))
    tree.pop("bootstrap_servers", None)
    cfg = tree["pipeline"]
    examples = os.path.relpath(REPO / "examples", root)  # relative: the job's copy makes it absolute
    cfg.update(name=run_id, runs_dir=str(root / "runs"), plugin_paths=[examples], live=False, steps=STEPS,
               timeout_s=JOB_TIMEOUT_S)
    cfg.pop("sft", None)
    cfg["evaluation"] = {"every_versions": 0, "final_samples_per_problem": 0}
    cfg["tasks"]["options"].update(num_train=64, num_heldout=4)
    tree["gateway"] = {"backend": "process", "port": 8710}
    tree["rollout"]["data"]["samples_per_task"] = 4
    tree["rollout"]["manager"].update(max_concurrent_episodes=8, train_groups_per_version=2)
    tree["rollout"]["manager"]["pool"].update(sandboxes=8, generations=8)
    tree["assembler"]["grouping"]["group_size"] = 4
    tree["assembler"]["mixture"]["batch_size"] = 2
    tree["trainer"]["backend"] = {"device": "cpu"}
    placeholder = "192.0.2.1"  # the job sets each host's address to its node's
    tree["cluster"] = {
        "run_id": run_id,
        "broker_heap": "384m",
        "setup_timeout_s": 600,
        "hosts": [
            {"name": "work", "address": placeholder, "roles": ["broker", "gateway", "inference", "rollout"]},
            {"name": "learn", "address": placeholder, "roles": ["assembler", "trainer"]},
        ],
    }
    return tree


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT_S + 300)
def test_sbatch_runs_the_cluster_on_its_allocation_and_ends_when_training_ends(tmp_path: Path) -> None:
    for problem in (netlab_problem(), slurm_problem()):
        assert problem is None, problem
    assert shutil.which("bwrap"), "bubblewrap is missing: run `stacx infra up`"
    assert (kafka.jar_dir() / ".complete").exists(), "no Kafka jars: run `stacx infra up` once"
    run_id = f"slurm-{tmp_path.name[-10:].replace('_', '-')}"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(cluster_file(tmp_path, run_id)))
    with NetLab(["ctl", "n1", "n2"]) as lab, SlurmLab(
        lab, tmp_path / "slurm", controller="ctl", nodes=["n1", "n2"], cpus=2, memory_mb=8192
    ) as slurm:
        env = {"STACX": str(Path(sys.executable).with_name("stacx")), "STACX_HOME": str(lab_home(tmp_path)),
               "STACX_JOB_FILE": str(tmp_path / "job.yaml")}
        os.environ.update(env)  # sbatch exports the submitting environment to the job
        try:
            submitted = slurm.run(
                ["sbatch", "--parsable", "--nodes=2", "--cpus-per-task=2", "--mem=6G", "--time=30",
                 str(REPO / "examples" / "cluster" / "sbatch.sh"), str(cluster)],
                cwd=tmp_path,
            )
        finally:
            for name in env:
                os.environ.pop(name, None)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().split(";")[0]
        deadline, state = time.monotonic() + JOB_TIMEOUT_S, ""
        while time.monotonic() < deadline and state not in FINAL:
            time.sleep(5)
            state = slurm.job_state(job)
        log = (tmp_path / f"stacx-{job}.log").read_text(errors="replace")
        if state not in FINAL:
            slurm.run(["scancel", job])
        assert state == "COMPLETED", f"job {job}: {state or 'unknown'}\n{log[-4000:]}"
    bound = yaml.safe_load((tmp_path / "job.yaml").read_text())
    addresses = {h["name"]: h["address"] for h in bound["cluster"]["hosts"]}
    assert addresses == {"work": lab.hosts["n1"].address, "learn": lab.hosts["n2"].address}
    assert bound["pipeline"]["plugin_paths"] == [str(REPO / "examples")]  # absolute in the job's copy
    assert "training ended (status 0)" in log, log[-4000:]
    assert "stacx node: stopped by SIGTERM" in log and "task 0: Killed" not in log, log[-4000:]  # gracefully
    state_file = next((tmp_path / "runs").glob("*/checkpoints/*/trainer_state.json"), None)
    assert state_file is not None, log[-4000:]
    checkpoints = sorted((tmp_path / "runs").glob("*/checkpoints/*/trainer_state.json"))
    assert max(json.loads(p.read_text()).get("step", 0) for p in checkpoints) >= STEPS, log[-4000:]
