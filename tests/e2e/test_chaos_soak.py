"""The chaos soak, short: `bench/chaos.py --quick` kills services (and restarts the broker) while
the pipeline trains, then audits the topics, the assembler's state and the trainer's lineage.

Needs Kafka (started by `stacx infra up`: the broker restart uses its pid file), Docker and the
sandbox image. Checks that nothing is lost or trained twice and that nothing is left behind; the
learning under fire is measured by the full benchmark (docs/performance.md), not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from process_checks import run_processes

REPO = Path(__file__).resolve().parents[2]


def _chaos(name: str, *flags: str) -> list[str]:
    """`bench/chaos.py --quick` for run `name`: tiny SFT, tasks and batches."""
    return [sys.executable, str(REPO / "bench" / "chaos.py"), "--quick", "--name", name, *flags]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_short_soak_under_kills_loses_nothing_and_leaves_nothing(
        kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path) -> None:
    name = f"chaos-{uuid.uuid4().hex[:6]}"
    out = subprocess.run(_chaos(name, "--json", "--minutes", "3", "--interval-s", "20", "--seed", "1"),
                         cwd=tmp_path, capture_output=True, text=True, timeout=1400)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pipeline_error"] is None, result
    assert result["kills"] >= 3 and result["policy_versions"] >= 2, result
    for key in ("lost", "trained_twice", "version_regressions", "orphans", "leaked_containers"):
        assert result[key] == 0, (key, result)
    assert result["broker_restarts"] >= 1 and result["batches"] >= 2, result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_mid_soak_stops_every_service_and_sandbox(
        kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path) -> None:
    name = f"chaos-term-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(_chaos(name, "--no-broker", "--minutes", "5", "--interval-s", "5", "--seed", "2"),
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # until the first strike: the services run and episodes are in flight
        lines.append(line)
        if "chaos: " in line and " at policy version " in line:
            break
    assert proc.poll() is None, "".join(lines[-30:])
    assert run_processes(f"{name}-"), "the run's services should be running"
    proc.terminate()
    _, rest = proc.communicate(timeout=300)
    stderr = "".join(lines) + rest
    assert proc.returncode == 128 + 15, stderr[-3000:]
    assert stderr.count("stopped by SIGTERM") == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[stderr.index("Traceback") - 1000:][:4000]
    assert run_processes(f"{name}-") == []
    owners = [c.labels.get("stacx.sandbox.owner", "")
              for c in docker_client.containers.list(all=True, filters={"label": "stacx.sandbox.owner"})]
    assert not [o for o in owners if o.startswith(f"stacx-{name}-")]
