"""SIGTERM to a running `stacx run` (what `timeout`, CI and service managers send) stops it cleanly:
no service process, no rank and no sandbox container of the run remains; one line, no traceback,
exit status 143. Needs the real services (`stacx infra up`; `make test` does it).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from run_names import run_name

from stacx.sandbox.backends.docker import LABEL_OWNER

REPO = Path(__file__).resolve().parents[2]
STACX = str(Path(sys.executable).with_name("stacx"))


def _short_config(tmp_path: Path, bootstrap: str) -> tuple[Path, str]:
    tree: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    name = run_name("sigterm")
    tree["bootstrap_servers"] = bootstrap
    p = tree["pipeline"]
    p.update(name=name, runs_dir=str(tmp_path), steps=50, live=False, timeout_s=600)
    p["tasks"]["options"].update(num_train=64, num_heldout=8)
    p["sft"].update(steps=4, skill_steps=2, batch_size=8)
    p["evaluation"].update(every_versions=0)
    tree["gateway"].update(port=free_port(), sessions={"warm_pool_size": 2})
    tree["inference"]["server"]["port"] = free_port()
    tree["rollout"]["manager"]["max_concurrent_episodes"] = 8
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path, name


def _run_containers(docker_client: Any, name: str) -> list[dict[str, Any]]:
    """The run's containers, from the engine's own list in one call (docker-py's `containers.list`
    inspects each one afterwards, and a sandbox removed in between raises NotFound)."""
    found = docker_client.api.containers(all=True, filters={"label": LABEL_OWNER})
    return [c for c in found if (c.get("Labels") or {}).get(LABEL_OWNER, "").startswith(f"stacx-{name}-")]


def _service_pids(log: Path) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"started (\w+) \(pid (\d+)\)", log.read_text())}


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _rolling_out(log: Path) -> bool:
    """The rollout service has found its server and gateway up and starts episodes (it is started
    with them and waits for them itself)."""
    return log.exists() and "answered (waited" in log.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_to_stacx_run_leaves_no_process_and_no_container(
    kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path
) -> None:
    config, name = _short_config(tmp_path, kafka_bootstrap)
    out = (tmp_path / "run.out").open("w")
    proc = subprocess.Popen([STACX, "run", str(config), "--no-live"], stdout=out, stderr=subprocess.STDOUT)
    logs = tmp_path / name / "logs"
    deadline = time.monotonic() + 420
    while not (_rolling_out(logs / "rollout.log") and _run_containers(docker_client, name)):
        assert proc.poll() is None, (tmp_path / "run.out").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run never reached GRPO with sandboxes running"
        time.sleep(1.0)
    time.sleep(5.0)  # rollouts in flight: sandboxes, generations, trajectories
    pids = _service_pids(logs / "pipeline.log")
    assert {"gateway", "inference", "assembler", "trainer", "rollout"} <= set(pids)

    proc.send_signal(signal.SIGTERM)
    status = proc.wait(timeout=180)
    output = (tmp_path / "run.out").read_text()

    assert status == 143, output[-3000:]
    assert "stacx run: stopped by SIGTERM" in output
    assert "Traceback" not in output, output[-3000:]
    alive = {service: pid for service, pid in pids.items() if _group_alive(pid)}
    assert not alive, f"service process groups still alive after the run stopped: {alive}"
    left = _run_containers(docker_client, name)
    assert not left, f"{len(left)} sandbox containers of the run remain: {[c.get('Names') for c in left]}"
    assert (tmp_path / name / "report.json").is_file()  # the partial report is still written
