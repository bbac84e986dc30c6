"""Runs of one name side by side, and how a run ended, read back with each tracker's own reader:
TensorBoard's `EventAccumulator`, `MlflowClient`, and `wandb leet inspect --summary --json`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_records import offline_runs

from stacx.infra.tracking import TrackedRun, TrackerSet, build_tracker
from stacx.infra.tracking.protocols import Outcome

FIRST, SECOND = "demo-20261202-000000", "demo-20261202-010000"


def _run(tmp_path: Path, tracker: str, run_id: str) -> TrackedRun:
    return TrackedRun(name="demo", run_id=run_id, dir=tmp_path / "tracking" / tracker)


def _log(tracker: str, tmp_path: Path, run_id: str, reward: float, outcome: Outcome) -> None:
    trackers = TrackerSet([(tracker, build_tracker(tracker, {}, _run(tmp_path, tracker, run_id)))])
    trackers.log_config({"pipeline": {"name": "demo"}})
    trackers.log_metrics(0, {"rollout/reward_mean": reward, "rollout/episodes": 8.0})
    trackers.log_metrics(1, {"rollout/reward_mean": 0.0, "rollout/episodes": 2.0})  # a straggler tail
    trackers.log_summary(0, {"rollout/reward_mean": reward, "rollout/episodes": 8.0})
    trackers.finish(outcome)


def _wandb_inspect(offline: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(offline)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    return json.loads(done.stdout)


def _mlflow_runs(tmp_path: Path) -> dict:
    from mlflow import MlflowClient

    store = (tmp_path / "tracking" / "mlflow").resolve() / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("demo")
    assert experiment is not None
    return {r.info.run_name: (client, r) for r in client.search_runs([experiment.experiment_id])}


def test_tensorboard_keeps_two_runs_of_one_name_apart(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log("tensorboard", tmp_path, FIRST, 0.25, "finished")
    _log("tensorboard", tmp_path, SECOND, 0.75, "killed")
    for run_id, reward, outcome in ((FIRST, 0.25, "finished"), (SECOND, 0.75, "killed")):
        events = EventAccumulator(str(tmp_path / "tracking" / "tensorboard" / run_id))
        events.Reload()
        assert [(e.step, e.value) for e in events.Scalars("rollout/reward_mean")] == [(0, reward), (1, 0.0)]
        (text,) = events.Tensors("outcome/text_summary")
        assert text.tensor_proto.string_val[0].decode() == outcome


def test_mlflow_keeps_two_runs_of_one_name_and_marks_a_stopped_one_killed(tmp_path: Path) -> None:
    _log("mlflow", tmp_path, FIRST, 0.25, "finished")
    _log("mlflow", tmp_path, SECOND, 0.75, "killed")
    runs = _mlflow_runs(tmp_path)
    assert sorted(runs) == [FIRST, SECOND]
    for run_id, reward, status in ((FIRST, 0.25, "FINISHED"), (SECOND, 0.75, "KILLED")):
        client, run = runs[run_id]
        assert run.info.status == status
        history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
        assert sorted((m.step, m.value) for m in history) == [(0, reward), (1, 0.0)]
        assert run.data.tags["summary.version"] == "0"  # not the 2-episode tail
        assert float(run.data.tags["summary.rollout/reward_mean"]) == reward


def test_mlflow_marks_a_failed_run_failed(tmp_path: Path) -> None:
    _log("mlflow", tmp_path, FIRST, 0.25, "failed")
    (_, run), = _mlflow_runs(tmp_path).values()
    assert run.info.status == "FAILED"


def test_wandb_keeps_two_runs_of_one_name_and_marks_a_stopped_one_failed(tmp_path: Path) -> None:
    import wandb

    _log("wandb", tmp_path, FIRST, 0.25, "finished")
    _log("wandb", tmp_path, SECOND, 0.75, "killed")
    wandb.teardown()  # the service writes the files out as it stops
    inspected = map(_wandb_inspect, offline_runs(tmp_path / "tracking" / "wandb"))
    found = {info["run_id"]: info for info in inspected}
    assert sorted(found) == [FIRST, SECOND]
    assert (found[FIRST]["state"], found[FIRST]["exit_code"]) == ("finished", 0)
    assert (found[SECOND]["state"], found[SECOND]["exit_code"]) == ("failed", 143)
    for run_id, reward in ((FIRST, 0.25), (SECOND, 0.75)):
        summary = found[run_id]["summary"]
        assert (summary["rollout/reward_mean"], summary["summary_version"]) == (reward, 0)


class _PlainTracker:
    """A plug-in written before outcomes: `finish()` takes nothing and has no summary."""

    def __init__(self) -> None:
        self.finished = 0

    def log_config(self, config: object) -> None: ...

    def log_metrics(self, step: int, metrics: object) -> None: ...

    def log_table(self, name: str, step: int, table: object) -> None: ...

    def finish(self) -> None:
        self.finished += 1


@pytest.mark.parametrize("outcome", ["finished", "killed"])
def test_a_plugin_without_outcomes_is_still_finished(outcome: Outcome) -> None:
    plain = _PlainTracker()
    trackers = TrackerSet([("plain", plain)])
    trackers.log_summary(3, {"rollout/reward_mean": 1.0})
    trackers.finish(outcome)
    assert plain.finished == 1


def test_mlflow_takes_a_config_whose_keys_it_would_refuse(tmp_path: Path) -> None:
    run = _run(tmp_path, "mlflow", FIRST)
    tracker = build_tracker("mlflow", {}, run)
    tracker.log_config({"assembler": {"mixture": {"code:python": 0.5, "math": 0.5}}})
    tracker.finish()
    ((_, found),) = _mlflow_runs(tmp_path).values()
    assert found.data.params["assembler.mixture.code_python"] == "0.5"


def test_sigterm_kills_a_run_and_any_other_error_fails_it() -> None:
    from stacx.infra.pipeline.tracking import outcome_of

    assert outcome_of(None) == "finished"
    assert outcome_of(KeyboardInterrupt()) == "killed"  # `stacx` turns SIGTERM into SIGINT
    assert outcome_of(SystemExit(143)) == "killed"
    assert outcome_of(RuntimeError("trainer died")) == "failed"


def test_running_a_name_again_keeps_the_trackers_folder_and_clears_the_rest(tmp_path: Path) -> None:
    from stacx.infra.pipeline.layout import clear_run_dir
    from stacx.infra.pipeline.tracking import TRACKING_DIR

    root = tmp_path / "quickstart"
    (root / TRACKING_DIR / "mlflow").mkdir(parents=True)
    (root / TRACKING_DIR / "mlflow" / "mlflow.db").write_text("the first run")
    (root / "logs").mkdir()
    (root / "report.json").write_text("{}")
    clear_run_dir(root, keep=[TRACKING_DIR])
    assert sorted(p.name for p in root.iterdir()) == [TRACKING_DIR]
    assert (root / TRACKING_DIR / "mlflow" / "mlflow.db").read_text() == "the first run"
    clear_run_dir(tmp_path / "never-ran", keep=[TRACKING_DIR])  # nothing to clear
