"""`pipeline.tracking`: names like any plug-in, one line per bad entry at load, `stacx plugins`."""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stacx.infra.cli import main
from stacx.infra.pipeline.config import PipelineConfigError, parse_spec
from stacx.infra.tracking import Table, TrackingConfig, open_trackers

REPO = Path(__file__).resolve().parents[3]
MINIMAL: dict[str, Any] = {
    "pipeline": {
        "model": {"tiny": {}},
        "tasks": {"source": "quickstart.arithmetic:ArithmeticTasks"},
        "plugin_paths": [str(REPO / "examples")],
    },
    "rollout": {"data": {"samples_per_task": 4}},
}
PLUGIN = '''
class Recorder:
    """Keeps every call (a user's own tracker)."""

    calls = []

    def __init__(self, run, *, label="x"):
        self.run, self.label = run, label

    def log_config(self, config):
        self.calls.append(("config", self.label, dict(config)))

    def log_metrics(self, step, metrics):
        self.calls.append(("metrics", step, dict(metrics)))

    def log_table(self, name, step, table):
        self.calls.append(("table", name, step, len(table.rows)))

    def finish(self):
        self.calls.append(("finish", str(self.run.dir)))
'''


def _tracking(value: Any) -> dict[str, Any]:
    tree = copy.deepcopy(MINIMAL)
    tree["pipeline"]["tracking"] = value
    return tree


def _errors(tree: dict[str, Any]) -> list[str]:
    with pytest.raises(PipelineConfigError) as info:
        parse_spec(tree, source="f.yaml", check=False)
    return str(info.value).splitlines()


@pytest.fixture
def plugin_module(tmp_path: Path) -> Iterator[str]:
    name = f"trackerpkg_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_a_list_of_names_or_name_and_options_entries() -> None:
    spec = parse_spec(
        _tracking(["tensorboard", {"name": "mlflow", "options": {"experiment": "mine"}}]),
        source="f.yaml",
        check=False,
    )
    tracking = spec.pipeline.tracking
    assert tracking is not None
    assert [(t.name, t.options) for t in tracking.trackers] == [
        ("tensorboard", {}),
        ("mlflow", {"experiment": "mine"}),
    ]
    assert tracking.settle_versions == 2 and tracking.samples_per_version == 4
    longer = TrackingConfig.model_validate({"trackers": ["wandb"], "samples_per_version": 8})
    assert longer.samples_per_version == 8 and longer.trackers[0].name == "wandb"


def test_every_bad_entry_is_one_line_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    lines = _errors(
        _tracking(
            ["tensorbord", "wandb", {"name": "tensorboard", "options": {"flush": 1}}, "nopkg_xyz.trackers:T"]
        )
    )
    assert lines[0].startswith(
        "f.yaml: pipeline.tracking.trackers.0: 'tensorbord' is not a known tracker; use "
        "one of ['mlflow', 'tensorboard', 'wandb']"
    )
    assert lines[1] == (
        "f.yaml: pipeline.tracking.trackers.1: the wandb tracker needs the 'wandb' package: "
        "pip install 'stacx[wandb]'"
    )
    assert lines[2].startswith("f.yaml: pipeline.tracking.trackers.2: 'tensorboard': options do not fit: ")
    assert "flush" in lines[2]
    assert lines[3].startswith(
        "f.yaml: pipeline.tracking.trackers.3: 'nopkg_xyz.trackers:T': module 'nopkg_xyz' not found"
    )
    assert len(lines) == 4


def test_a_tracker_listed_twice_is_refused() -> None:
    (line,) = _errors(_tracking(["tensorboard", {"name": "tensorboard"}]))
    assert (
        line == "f.yaml: pipeline.tracking: trackers ['tensorboard'] are listed twice; list each tracker once"
    )


def test_a_users_tracker_by_dotted_path_gets_its_own_folder(plugin_module: str, tmp_path: Path) -> None:
    config = TrackingConfig.model_validate(
        [{"name": f"{plugin_module}:Recorder", "options": {"label": "mine"}}]
    )
    trackers = open_trackers(config, name="demo", run_id="demo-1", root=tmp_path / "tracking")
    trackers.log_config({"a": 1})
    trackers.log_metrics(3, {"rollout/reward_mean": 0.5})
    trackers.log_table("trajectories", 3, Table(columns=["a"], rows=[[1], [2]]))
    trackers.finish()
    calls = sys.modules[plugin_module].Recorder.calls  # type: ignore[attr-defined]
    assert calls == [
        ("config", "mine", {"a": 1}),
        ("metrics", 3, {"rollout/reward_mean": 0.5}),
        ("table", "trajectories", 3, 2),
        ("finish", str(tmp_path / "tracking" / "Recorder")),
    ]
    assert trackers.locations == {f"{plugin_module}:Recorder": tmp_path / "tracking" / "Recorder"}


def test_a_tracker_that_raises_is_named_once_and_the_others_go_on(
    plugin_module: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = sys.modules.get(plugin_module) or __import__(plugin_module)

    class Broken:
        def __init__(self, run: Any) -> None: ...
        def log_config(self, config: Any) -> None: ...
        def log_metrics(self, step: int, metrics: Any) -> None:
            raise OSError("disk full")

        def log_table(self, name: str, step: int, table: Any) -> None: ...
        def finish(self) -> None: ...

    module.Broken = Broken
    config = TrackingConfig.model_validate([f"{plugin_module}:Broken", f"{plugin_module}:Recorder"])
    trackers = open_trackers(config, name="demo", run_id="demo-1", root=tmp_path)
    with caplog.at_level(logging.ERROR):
        trackers.log_metrics(1, {"x": 1.0})
        trackers.log_metrics(2, {"x": 2.0})
    trackers.finish()
    (record,) = caplog.records
    assert record.getMessage() == (
        f"tracker {plugin_module}:Broken: log_metrics raised OSError: disk full; it gets nothing more"
    )
    steps = [c[1] for c in module.Recorder.calls if c[0] == "metrics"]
    assert steps == [1, 2]


def test_stacx_plugins_lists_the_trackers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plugins", "trackers"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "trackers  (entry-point group stacx.trackers; or package.module:object)" in out
    for name, summary in (
        ("mlflow", "One MLflow run"),
        ("tensorboard", "TensorBoard event files"),
        ("wandb", "An offline W&B run"),
    ):
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert "builtin (stacx.infra.tracking)" in line and summary in line


def test_a_tracker_that_cannot_be_built_stops_the_run_with_one_line(
    plugin_module: str, tmp_path: Path
) -> None:
    from stacx.infra.pipeline.errors import PipelineError
    from stacx.infra.pipeline.layout import RunLayout
    from stacx.infra.pipeline.tracking import start_tracking

    module = sys.modules.get(plugin_module) or __import__(plugin_module)

    def refusing(run: Any) -> Any:
        raise PermissionError(f"{run.dir} is read-only")

    module.refusing = refusing
    tree = _tracking(["tensorboard", f"{plugin_module}:refusing"])
    tree["pipeline"]["runs_dir"] = str(tmp_path)
    spec = parse_spec(tree, source="f.yaml", check=False)
    layout = RunLayout.create(spec)
    with pytest.raises(PipelineError) as caught:
        start_tracking(
            spec,
            layout,
            keeps=lambda t, v: True,
            inference_url="http://127.0.0.1:1",
            gateway_url="http://127.0.0.1:2",
            token="t",
        )
    message = str(caught.value)
    assert message.startswith(
        f"f.yaml: pipeline.tracking.trackers[1]: '{plugin_module}:refusing': building the tracker raised "
    )
    assert message.endswith(f"PermissionError: {layout.root / 'tracking' / 'refusing'} is read-only")
    assert "\n" not in message


def test_the_trackers_get_the_resolved_config_defaults_included(tmp_path: Path) -> None:
    from stacx.infra.pipeline import load_spec
    from stacx.infra.pipeline.layout import RunLayout
    from stacx.infra.pipeline.tracking import run_config

    spec = load_spec(Path(__file__).resolve().parents[3] / "examples" / "quickstart.yaml")
    spec.pipeline.runs_dir = str(tmp_path)
    config = run_config(spec, RunLayout.create(spec))
    trainer = config["services"]["trainer"]
    assert trainer["optimizer"]["max_grad_norm"] == 1.0  # a default the quickstart file does not write
    assert "max_grad_norm" not in str(config["written"]["trainer"])
    assert set(config["services"]) >= {"rollout", "assembler", "trainer"}


def test_a_trackers_dotted_path_imports_from_plugin_paths(tmp_path: Path) -> None:
    """The tracker's module lives in a folder of `pipeline.plugin_paths` (relative to the file),
    as a reward's would: it validates, no PYTHONPATH needed."""
    folder = tmp_path / "mytrackers"
    folder.mkdir()
    module = f"trk_{tmp_path.name.replace('-', '_')}"
    (folder / f"{module}.py").write_text(PLUGIN)
    tree = _tracking([{"name": f"{module}:Recorder", "options": {"label": "y"}}])
    tree["pipeline"]["plugin_paths"].append("mytrackers")
    try:
        spec = parse_spec(tree, source="f.yaml", base_dir=tmp_path, check=False)
        assert spec.pipeline.tracking is not None
        assert [t.name for t in spec.pipeline.tracking.trackers] == [f"{module}:Recorder"]
    finally:
        sys.path[:] = [p for p in sys.path if p != str(folder)]
        sys.modules.pop(module, None)
