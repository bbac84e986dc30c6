"""End-to-end smoke test: a short quickstart through the real services.

Kafka, Docker and the sandbox image must be up (`stacx infra up`; `make test` does it). The run
trains for a few GRPO steps; it checks the plumbing (the policy version advances and each new
weight version reaches the inference server), not the learning (docs/quickstart.md has that).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from small_runs import shrink

from stacx.infra.pipeline import load_spec, run_pipeline

REPO = Path(__file__).resolve().parents[2]
STEPS = 2


def _small(spec: Any, runs_dir: Path) -> Any:
    cfg = spec.pipeline
    cfg.tasks.options.update(num_train=64, num_heldout=8)
    cfg.sft.steps, cfg.sft.batch_size = 10, 16
    cfg.evaluation.every_versions = 0
    return shrink(spec, runs_dir, steps=STEPS, timeout_s=540.0, samples_per_task=4,
                  max_concurrent_episodes=16, group_size=4)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_short_quickstart_advances_the_policy_and_swaps_weights(
        kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path) -> None:
    spec = _small(load_spec(REPO / "examples" / "quickstart.yaml"), tmp_path)
    spec.bootstrap_servers = kafka_bootstrap
    report = run_pipeline(spec)

    assert report["status"] == "ok", report["error"]
    assert report["policy_versions"] >= STEPS
    assert str(STEPS) in report["server_weight_versions_seen"]  # the swap reached the server
    assert report["num_batches"] >= STEPS and report["num_trajectories"] > 0
    for key in ("success_before", "success_after"):
        assert 0.0 <= report[key] <= 1.0
    root = tmp_path / spec.pipeline.name
    assert json.loads((root / "report.json").read_text())["run_id"] == report["run_id"]
    assert (root / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    exported = sorted((root / "weights" / "policy").glob("v*"))
    assert exported and (exported[-1] / "model.safetensors").is_file()
