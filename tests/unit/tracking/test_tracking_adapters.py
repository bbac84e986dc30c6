"""Each shipped tracker against its real library, read back with that tool's own reader."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from wandb_records import config as wandb_config
from wandb_records import history as wandb_history
from wandb_records import offline_runs, records

from stacx.infra.tracking import Table, TrackedRun, build_tracker

CONFIG = {"pipeline": {"name": "demo", "steps": 3}, "trainer": {"recipe": "grpo"}}
TABLE = Table(
    columns=["task_id", "reward", "answer"], rows=[["t1", 1.0, "a | b"], ["t2", 0.0, "line\nbreak"]]
)


def _feed(tracker: object) -> None:
    """What a run logs, in the order a run logs it: trainer figures of versions 1 and 2 before
    the rollout figures of version 0 and 1 (those settle later)."""
    tracker.log_config(CONFIG)  # type: ignore[attr-defined]
    tracker.log_metrics(1, {"trainer/loss": 0.5, "trainer/policy/grad_norm": 2.0})  # type: ignore[attr-defined]
    tracker.log_metrics(2, {"trainer/loss": 0.25})  # type: ignore[attr-defined]
    tracker.log_metrics(0, {"rollout/reward_mean": 0.125})  # type: ignore[attr-defined]
    tracker.log_table("trajectories", 0, TABLE)  # type: ignore[attr-defined]
    tracker.log_metrics(1, {"rollout/reward_mean": 0.375})  # type: ignore[attr-defined]
    tracker.finish()  # type: ignore[attr-defined]


def _run(tmp_path: Path, name: str) -> TrackedRun:
    return TrackedRun(name="demo", run_id="demo-20261202-000000", dir=tmp_path / "tracking" / name)


def test_tensorboard_event_files_hold_each_series_by_version(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _run(tmp_path, "tensorboard")
    _feed(build_tracker("tensorboard", {"flush_secs": 1}, run))

    events = EventAccumulator(str(run.dir / run.run_id))  # each run its own subfolder
    events.Reload()
    series = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert series == {
        "trainer/loss": [(1, 0.5), (2, 0.25)],
        "trainer/policy/grad_norm": [(1, 2.0)],
        "rollout/reward_mean": [(0, 0.125), (1, 0.375)],
    }
    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}
    (table,) = texts["trajectories/text_summary"]
    markdown = table.tensor_proto.string_val[0].decode()
    assert table.step == 0 and "| task_id | reward | answer |" in markdown
    assert "a \\| b" in markdown and "line<br>break" in markdown  # cells cannot break the table
    (config,) = texts["config/text_summary"]
    assert "recipe: grpo" in config.tensor_proto.string_val[0].decode()


def test_wandb_offline_run_holds_each_series_by_version_and_sync_would_upload_it(tmp_path: Path) -> None:
    import wandb

    run = _run(tmp_path, "wandb")
    _feed(build_tracker("wandb", {"project": "stacx-tests"}, run))
    # `finish()` returns before W&B's service process has flushed the run's file (about one
    # time in five here); it is complete once the service stops, as at the process's exit
    wandb.teardown()

    (offline,) = offline_runs(run.dir)
    rows = wandb_history(offline)
    series: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(("trainer/", "rollout/")) and isinstance(value, int | float):
                series.setdefault(key, []).append((row["policy_version"], float(value)))  # JSON: 2.0 is 2
    kinds = Counter(r.WhichOneof("record_type") for r in records(offline))
    files = sorted(f"{p.name}:{p.stat().st_size}" for p in offline.iterdir())
    assert series == {
        "trainer/loss": [(1, 0.5), (2, 0.25)],
        "trainer/policy/grad_norm": [(1, 2.0)],
        "rollout/reward_mean": [(0, 0.125), (1, 0.375)],
    }, f"{len(rows)} history rows; records {dict(kinds)}; files {files}"
    (table_row,) = [r for r in rows if "trajectories/_type" in r]
    assert table_row["policy_version"] == 0 and table_row["trajectories/_type"] == "table-file"
    assert table_row["trajectories/nrows"] == 2
    assert (offline / "files" / table_row["trajectories/path"]).is_file()
    assert wandb_config(offline)["trainer"] == {"recipe": "grpo"}

    dry_run = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", str(offline)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "Would sync 1 run(s)" in dry_run.stdout + dry_run.stderr


def test_mlflow_store_under_the_run_holds_each_series_by_version(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    run = _run(tmp_path, "mlflow")
    tracker = build_tracker("mlflow", {}, run)
    _feed(tracker)

    client = MlflowClient(tracking_uri=f"sqlite:///{run.dir.resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("demo")
    assert experiment is not None
    assert experiment.artifact_location == (run.dir.resolve() / "artifacts").as_uri()  # not ./mlruns
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == run.run_id and found.info.status == "FINISHED"

    def series(name: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, name))

    assert series("trainer/loss") == [(1, 0.5), (2, 0.25)]
    assert series("rollout/reward_mean") == [(0, 0.125), (1, 0.375)]
    assert found.data.params["trainer.recipe"] == "grpo" and found.data.params["pipeline.steps"] == "3"
    local = client.download_artifacts(found.info.run_id, "trajectories/v000000.json", str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text()) == {
        "columns": ["task_id", "reward", "answer"],
        "data": [["t1", 1.0, "a | b"], ["t2", 0.0, "line\nbreak"]],
    }


@pytest.mark.parametrize(
    ("name", "module", "extra"),
    [
        ("wandb", "wandb", "wandb"),
        ("tensorboard", "tensorboard", "tensorboard"),
        ("mlflow", "mlflow", "mlflow"),
    ],
)
def test_a_missing_package_is_one_line_naming_the_extra(
    name: str, module: str, extra: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stacx.infra.tracking import MissingTrackerPackage, tracker_problem

    monkeypatch.setitem(sys.modules, module, None)  # how Python sees a package that is not installed
    expected = f"the {name} tracker needs the {module!r} package: pip install 'stacx[{extra}]'"
    assert tracker_problem(name, {}) == expected
    with pytest.raises(MissingTrackerPackage) as caught:
        build_tracker(name, {}, _run(tmp_path, name))
    assert str(caught.value) == expected
