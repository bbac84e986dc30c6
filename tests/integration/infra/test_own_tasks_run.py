"""`stacx run` on your own model and your own tasks: examples/own-tasks.yaml, pointed at a model
directory made by `stacx models tiny` with another shape than the quickstart's, and at a small
Harbor task folder (not arithmetic), trains end to end through the real services.

Kafka, Docker and the sandbox image must be up (`stacx infra up`; `make test` does it). The check
is the plumbing (policy versions advance, each reaches the inference server, the user's model and
tasks are what the services got), not the learning: a random model solves no task.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ports import free_port
from run_names import run_name

REPO = Path(__file__).resolve().parents[3]
STACX = str(Path(sys.executable).with_name("stacx"))
STEPS = 2
SHAPE = {
    "--hidden-size": "48",
    "--intermediate-size": "96",
    "--layers": "3",
    "--heads": "4",
    "--kv-heads": "2",
}


def _model(tmp_path: Path) -> Path:
    out = tmp_path / "my-model"
    args = [STACX, "models", "tiny", "--out", str(out), "--seed", "3"]
    for flag, value in SHAPE.items():
        args += [flag, value]
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    return out


def _tasks(tmp_path: Path) -> Path:
    root = tmp_path / "my-tasks"
    for name in ("write-file", "sort-files"):
        shutil.copytree(REPO / "examples" / "tasks" / name, root / name)
    return root


def _config(tmp_path: Path, bootstrap: str, model: Path, tasks: Path) -> tuple[Path, str]:
    tree: dict[str, Any] = yaml.safe_load((REPO / "examples" / "own-tasks.yaml").read_text())
    name = run_name("own")
    tree["bootstrap_servers"] = bootstrap
    p = tree["pipeline"]
    p.update(
        name=name,
        runs_dir=str(tmp_path / "runs"),
        steps=STEPS,
        live=False,
        timeout_s=720,
        stall_timeout_s=240,
    )
    p["model"] = {"path": "my-model"}  # relative: resolved against the config file's folder
    p["tasks"] = {"harbor": "my-tasks"}
    tree["gateway"] = {"port": free_port()}
    tree["inference"] = {"server": {"port": free_port()}}
    p["evaluation"] = {"every_versions": 0, "final_samples_per_problem": 1}
    tree["rollout"]["data"]["samples_per_task"] = 2
    tree["rollout"]["manager"]["train_groups_per_version"] = 1
    default = tree["rollout"]["manager"]["evaluators"]["default"]
    default.update(max_turns=2, max_new_tokens=24, max_tokens=1024)
    tree["assembler"]["grouping"]["group_size"] = 2
    tree["assembler"]["mixture"]["batch_size"] = 1
    path = tmp_path / "my.yaml"
    assert model.parent == tasks.parent == path.parent
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path, name


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stacx_run_trains_my_model_on_my_harbor_tasks(
    kafka_bootstrap: str, docker_client: Any, sandbox_image: str, tmp_path: Path
) -> None:
    model, tasks = _model(tmp_path), _tasks(tmp_path)
    config_json = (model / "config.json").read_text()
    path, name = _config(tmp_path, kafka_bootstrap, model, tasks)

    explained = subprocess.run(
        [STACX, "run", str(path), "--explain"], capture_output=True, text=True, timeout=120
    )
    assert explained.returncode == 0, explained.stderr
    services = yaml.safe_load(explained.stdout)["services"]
    assert services["trainer"]["models"]["policy"]["path"] == str(model)
    assert services["rollout"]["data"]["task_dirs"] == str(tasks)

    done = subprocess.run([STACX, "run", str(path)], capture_output=True, text=True, timeout=840)
    root = tmp_path / "runs" / name
    report = json.loads((root / "report.json").read_text())
    assert done.returncode == 0, (report.get("error"), done.stderr[-3000:])
    assert report["status"] == "ok" and report["policy_versions"] >= STEPS
    assert str(STEPS) in report["server_weight_versions_seen"]  # the last version reached the server
    assert report["num_trajectories"] >= 2 * STEPS and report["num_batches"] >= STEPS
    assert report["heldout_episodes"] == 2  # both Harbor tasks, once each, before and after

    served = yaml.safe_load((root / "config" / "trainer.yaml").read_text())
    assert served["models"]["policy"]["path"] == str(model)  # the user's model, as given
    rollout = yaml.safe_load((root / "config" / "rollout.yaml").read_text())
    assert rollout["data"]["task_dirs"] == str(tasks) and rollout["inference"]["tokenizer"] == str(model)
    heldout = [json.loads(line) for line in (root / "tasks" / "heldout.jsonl").read_text().splitlines()]
    assert sorted(row["task_id"] for row in heldout) == ["stacx-sort-files", "stacx-write-file"]
    assert (model / "config.json").read_text() == config_json  # never written to
    assert json.loads(config_json)["hidden_size"] == 48
    print(json.dumps({k: report[k] for k in ("wall_s", "timings_s", "num_trajectories", "num_batches")}))
    exported = sorted((root / "weights" / "policy").glob("v*"))
    assert exported and (exported[-1] / "model.safetensors").is_file()
