"""A short real pipeline run, then two replays of its trajectories topic with the same settings
(same batch ids, batch bytes and CPU weights) and a third with another recipe."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from run_names import run_name
from test_quickstart_e2e import REPO, _small

from stacx.infra.config import build
from stacx.infra.pipeline import load_spec, run_pipeline
from stacx.infra.replay import ReplayFile, run_replay
from stacx.infra.services import topic_admin


def _replay(bootstrap: str, source: str, name: str, model: Path, runs: Path, recipe: str) -> dict[str, Any]:
    tree = {
        "bootstrap_servers": bootstrap,
        "replay": {"name": name, "source_topic": source, "runs_dir": str(runs)},
        "assembler": {"grouping": {"group_size": 4}, "mixture": {"batch_size": 2}},
        "trainer": {
            "recipe": recipe,
            "seed": 1,
            "models": {"policy": {"path": str(model)}},
            "optimizer": {"lr": 1.0e-4, "warmup_steps": 1},
            "backend": {"kind": "single", "device": "cpu"},
            "source": {"idle_timeout_s": 5},
        },
    }
    return run_replay(build(ReplayFile, tree, where="replay"), base_dir=runs)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_replays_of_a_real_run_are_identical(
    kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path
) -> None:
    spec = _small(load_spec(REPO / "examples" / "quickstart.yaml"), tmp_path)
    spec.bootstrap_servers = kafka_bootstrap
    report = run_pipeline(spec)
    assert report["status"] == "ok", report["error"]
    run_id = report["run_id"]
    source = f"stacx.trajectories.{run_id}"
    model = tmp_path / spec.pipeline.name / "models" / "base"
    tag = uuid.uuid4().hex[:6]
    names = [run_name(f"replay-a-{tag}"), run_name(f"replay-b-{tag}"), run_name(f"replay-sft-{tag}")]
    try:
        first = _replay(kafka_bootstrap, source, names[0], model, tmp_path / "replays", "grpo")
        second = _replay(kafka_bootstrap, source, names[1], model, tmp_path / "replays", "grpo")
        other = _replay(kafka_bootstrap, source, names[2], model, tmp_path / "replays", "sft")
    finally:
        for name in [*names, run_id]:
            try:
                topic_admin.delete_run(kafka_bootstrap, name)
            except Exception:  # a replay that never created its topics
                pass
    # the whole topic: what the run counted, and what its rollouts wrote while it shut down
    assert first["records"] >= report["num_trajectories"] > 0 and first["batches"] >= 1
    assert (first["batch_ids"], first["batch_sha256"]) == (second["batch_ids"], second["batch_sha256"])
    assert first["final_weights"]["content_hash"] == second["final_weights"]["content_hash"]
    assert other["final_weights"] is not None and other["recipe"] == "sft"
