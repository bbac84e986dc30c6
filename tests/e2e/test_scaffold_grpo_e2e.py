"""End-to-end smoke test: a short GRPO run through a black-box scaffold (mini-swe-agent).

Kafka, Docker and the sandbox image must be up (`stacx infra up`; `make test` does it). The run
warm-starts on a few scaffold transcripts, then trains two GRPO steps with one mini-swe-agent
process per episode; it checks the plumbing (scaffold episodes reach the trainer, each new weight
version reaches the inference server, held-out episodes run before and after), not the learning
(docs/rollout.md has that).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from small_runs import shrink

from stacx.infra.pipeline import load_spec, run_pipeline

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "scaffold_grpo"
STEPS = 2
NUM_HELDOUT = 3


def _small(spec: Any, runs_dir: Path) -> Any:
    cfg = spec.pipeline
    heldout = runs_dir / "heldout"
    for task in sorted((EXAMPLE / "heldout").iterdir())[:NUM_HELDOUT]:
        shutil.copytree(task, heldout / task.name)
    cfg.tasks.harbor, cfg.tasks.heldout = str(EXAMPLE / "train"), str(heldout)
    cfg.transcripts.path = str(EXAMPLE / "transcripts.jsonl")
    cfg.sft.steps, cfg.sft.skill_steps, cfg.sft.batch_size = 12, 8, 8
    return shrink(spec, runs_dir, steps=STEPS, timeout_s=600.0, samples_per_task=2,
                  max_concurrent_episodes=4, group_size=2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_short_scaffold_grpo_run_trains_on_mini_swe_agent_episodes(
    kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path
) -> None:
    spec = _small(load_spec(EXAMPLE / "scaffold_grpo.yaml"), tmp_path)
    spec.bootstrap_servers = kafka_bootstrap
    report = run_pipeline(spec)

    assert report["status"] == "ok", report["error"]
    assert report["policy_versions"] >= STEPS
    assert str(STEPS) in report["server_weight_versions_seen"]  # the swap reached the server
    assert report["num_batches"] >= STEPS and report["num_trajectories"] >= STEPS * 4
    assert report["heldout_episodes"] == NUM_HELDOUT
    for key in ("success_before", "success_after"):
        assert 0.0 <= report[key] <= 1.0
    root = tmp_path / spec.pipeline.name
    assert sorted((root / "models" / "sft").glob("v*")), "the transcripts SFT exported no model"
    rollout_log = (root / "logs" / "rollout.log").read_text()
    assert "mini-swe-agent" in (root / "config" / "rollout.yaml").read_text()
    assert "Traceback" not in rollout_log
