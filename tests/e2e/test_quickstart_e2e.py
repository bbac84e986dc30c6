"""End-to-end smoke test: a short quickstart through the real services.

Kafka, Docker and the sandbox image must be up (`stacx infra up`; `make test` does it). The run
trains for a few GRPO steps; it checks the plumbing (the policy version advances and each new
weight version reaches the inference server), not the learning (docs/quickstart.md has that).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from ports import free_port

from infra.pipeline import load_spec, run_pipeline

REPO = Path(__file__).resolve().parents[2]
STEPS = 2


def _small(spec: Any, runs_dir: Path) -> Any:
    cfg = spec.pipeline
    cfg.name, cfg.runs_dir, cfg.steps, cfg.live = f"e2e-{uuid.uuid4().hex[:6]}", str(runs_dir), \
        STEPS, False
    cfg.timeout_s = 540.0
    cfg.tasks.arithmetic.num_train, cfg.tasks.arithmetic.num_heldout = 64, 8
    cfg.sft.steps, cfg.sft.batch_size = 10, 16
    cfg.evaluation.every_versions, cfg.evaluation.final_samples_per_problem = 0, 1
    cfg.services.gateway_port, cfg.services.inference_port = free_port(), free_port()
    cfg.services.gateway_warm_pool = 0
    spec.rollout["data"]["samples_per_task"] = 4
    spec.rollout["manager"]["train_groups_per_version"] = 2
    spec.rollout["manager"]["max_concurrent_episodes"] = 16
    spec.assembler["grouping"]["group_size"] = 4
    spec.assembler["mixture"]["batch_size"] = 2
    return spec


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
