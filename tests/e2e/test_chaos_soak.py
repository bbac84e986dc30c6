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

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_short_soak_under_kills_loses_nothing_and_leaves_nothing(
        kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path) -> None:
    name = f"chaos-{uuid.uuid4().hex[:6]}"
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "chaos.py"), "--json", "--quick", "--minutes", "3",
         "--interval-s", "20", "--seed", "1", "--name", name],
        cwd=tmp_path, capture_output=True, text=True, timeout=1400)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pipeline_error"] is None, result
    assert result["kills"] >= 3 and result["policy_versions"] >= 2, result
    for key in ("lost", "trained_twice", "version_regressions", "orphans", "leaked_containers"):
        assert result[key] == 0, (key, result)
    assert result["broker_restarts"] >= 1 and result["batches"] >= 2, result
