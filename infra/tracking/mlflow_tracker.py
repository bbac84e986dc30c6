"""MLflow with a store under the run: a SQLite file and an artifact folder, no server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from stacx.infra.tracking.figures import figure_name
from stacx.infra.tracking.protocols import Outcome, Table, TrackedRun
from stacx.infra.tracking.requirements import Requirement

__all__ = ["STATUSES", "MlflowTracker", "flatten"]

MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_CHARS = 6000
"""MLflow's limits on one `log_batch` call and on a parameter value."""
STATUSES: dict[str, str] = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
"""MLflow's run status per outcome."""

T = TypeVar("T")


class MlflowTracker:
    """One MLflow run in `runs/<name>/tracking/mlflow/` (`mlflow.db`, `artifacts/`)."""

    requires: ClassVar[Requirement] = Requirement("mlflow", ("mlflow", "sqlalchemy", "alembic"), "mlflow")

    def __init__(
        self, run: TrackedRun, *, tracking_uri: str | None = None, experiment: str | None = None
    ) -> None:
        """`tracking_uri`: another store (default: `sqlite:///<dir>/mlflow.db`); `experiment`:
        the experiment name (default: the run name)."""
        self.requires.load()
        from mlflow import MlflowClient

        run.dir.mkdir(parents=True, exist_ok=True)
        root = run.dir.resolve()
        self.tracking_uri = tracking_uri or f"sqlite:///{root / 'mlflow.db'}"
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment_id = self._experiment(experiment or run.name, root / "artifacts")
        self.run_id: str = self._client.create_run(experiment_id, run_name=run.run_id).info.run_id
        self._last_ms = 0
        """Each call's timestamp is later than the previous one's: a version's revised row is the
        latest value at its step."""

    def _experiment(self, name: str, artifacts: Path) -> str:
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        return str(self._client.create_experiment(name, artifact_location=artifacts.as_uri()))

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v[:MAX_PARAM_CHARS]) for k, v in flatten(config).items()]
        for chunk in _chunks(params, MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=chunk)
        self._client.log_dict(self.run_id, json.loads(json.dumps(config, default=str)), "config.json")

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now_ms = self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)
        entries = [Metric(k, float(v), now_ms, step) for k, v in metrics.items()]
        for chunk in _chunks(entries, MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=chunk)

    def log_table(self, name: str, step: int, table: Table) -> None:
        data = {"columns": list(table.columns), "data": [list(row) for row in table.rows]}
        self._client.log_dict(self.run_id, data, f"{name}/v{step:06d}.json")

    def log_summary(self, step: int, metrics: Mapping[str, float]) -> None:
        """MLflow shows a metric's value at its highest step: the summary goes to tags."""
        from mlflow.entities import RunTag

        tags = [RunTag(f"summary.{k}", repr(float(v))) for k, v in metrics.items()]
        for chunk in _chunks([*tags, RunTag("summary.version", str(step))], MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, tags=chunk)

    def finish(self, outcome: Outcome = "finished") -> None:
        self._client.set_terminated(self.run_id, status=STATUSES[outcome])


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1}}` -> `{"a.b": "1"}`: nested config as MLflow parameters."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{figure_name(str(key))}"  # MLflow refuses a batch with a key like `code:python`
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
