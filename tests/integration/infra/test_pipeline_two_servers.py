"""`stacx run` with `inference.servers: 2`: two built-in servers behind the run's router, one
killed (SIGKILL) mid-run. The router routes around it, the pipeline's supervision restarts it,
the run trains to the end, and no episode on the trajectories topic failed.

The built-in CPU server stands in for SGLang here (the router, the supervision and the weight
subscriber use only what both speak: `/generate` with `input_ids`, `/health`, `/get_model_info`,
`/update_weights_from_disk`). Kafka, Docker and the sandbox image must be up (`stacx infra up`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families
from run_names import run_name

from stacx.schemas.records import TrajectoryStatus

REPO = Path(__file__).resolve().parents[3]
STACX = str(Path(sys.executable).with_name("stacx"))
STEPS = 3


def _three_free_ports() -> int:
    """A port whose next two ports are free too (the router's, then the two servers')."""
    import socket

    for _ in range(50):
        port = free_port()
        try:
            for p in (port + 1, port + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise AssertionError("no three consecutive free ports")


def _config(tmp_path: Path, bootstrap: str) -> tuple[Path, str, int]:
    tree: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    name = run_name("servers")
    port = _three_free_ports()
    tree["bootstrap_servers"] = bootstrap
    p = tree["pipeline"]
    p.update(name=name, runs_dir=str(tmp_path / "runs"), steps=STEPS, live=False, timeout_s=800,
             stall_timeout_s=240, plugin_paths=[str(REPO / "examples")])
    p["sft"] = {"steps": 20, "skill_steps": 15, "batch_size": 16}
    p["tasks"]["options"].update(num_train=256, num_heldout=8)
    p["evaluation"] = {"every_versions": 0, "final_samples_per_problem": 0}
    tree["gateway"]["port"] = free_port()
    tree["inference"] = {"servers": 2, "server": {"port": port, "torch_threads": 1}}
    tree["rollout"]["manager"]["max_concurrent_episodes"] = 16
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path, name, port


def _traffic(server: str) -> tuple[float, int]:
    """(requests answered, requests running) by the server itself (sglang-router keeps no counts)."""
    try:
        text = httpx.get(f"{server}/metrics", timeout=5).text
        info = httpx.get(f"{server}/get_server_info", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return 0.0, 0
    answered = sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples if sample.name == "stacx_inference_requests_total")
    return answered, int(info["internal_states"][0]["running_requests"])


def _pid(log: Path, service: str) -> int | None:
    found = re.findall(rf"started {service} \(pid (\d+)\)", log.read_text()) if log.exists() else []
    return int(found[-1]) if found else None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_server_is_routed_around_and_restarted(
    kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path, fresh_group: str
) -> None:
    path, name, port = _config(tmp_path, kafka_bootstrap)
    victim = f"http://127.0.0.1:{port + 1}"  # inference-0; the router listens on `port`
    root = tmp_path / "runs" / name
    output = (tmp_path / "run.out").open("w")  # a file, not a pipe: nothing blocks the run
    run = subprocess.Popen([STACX, "run", str(path)], stdout=output, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            answered, running = _traffic(victim)
            if answered >= 20 and running > 0:
                break
            assert run.poll() is None, (tmp_path / "run.out").read_text()[-3000:]
            assert time.monotonic() < deadline, "no traffic reached inference-0"
            time.sleep(0.1)
        pid = _pid(root / "logs" / "pipeline.log", "inference-0")
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)  # mid-request, the whole process group
        run.wait(timeout=800)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait(120)
        output.close()
    stderr = (tmp_path / "run.out").read_text()
    report = json.loads((root / "report.json").read_text())
    assert run.returncode == 0, (report.get("error"), stderr[-3000:])
    assert report["status"] == "ok" and report["policy_versions"] >= STEPS
    log = (root / "logs" / "pipeline.log").read_text()
    assert "service inference-0 exited" in log and log.count("started inference-0 (pid") == 2
    assert str(STEPS) in report["server_weight_versions_seen"]
    records = _trajectories(kafka_bootstrap, report["topics"]["trajectories"], fresh_group,
                            report["num_trajectories"])
    assert len(records) == report["num_trajectories"] > 0
    failed = [r.error for r in records if r.status is TrajectoryStatus.FAILED]
    assert failed == [], failed[:3]


def _trajectories(bootstrap: str, topic: str, group: str, count: int) -> list[Any]:
    from stacx.consumers import EventConsumer

    config = EventConsumer.Config(bootstrap_servers=bootstrap, group_id=group, topics=[topic])
    consumer = EventConsumer(config)
    records: list[Any] = []
    try:
        for _ in range(60):
            records += [e.value for e in consumer.consume(max_records=max(1, count), timeout=1.0)]
            if len(records) >= count:
                break
    finally:
        consumer.close()
    return records
