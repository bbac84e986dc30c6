"""Weights & Biases in offline mode: nothing leaves the machine; `wandb sync` uploads later."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from stacx.infra.tracking.protocols import Outcome, Table, TrackedRun
from stacx.infra.tracking.requirements import Requirement

__all__ = ["EXIT_CODES", "STEP_METRIC", "WandbTracker"]

STEP_METRIC = "policy_version"
"""The x-axis of every chart: rows may come out of version order, so W&B's own step cannot be it."""
EXIT_CODES: dict[str, int] = {"finished": 0, "failed": 1, "killed": 143}
"""The exit code W&B records per outcome (W&B marks a run with a non-zero code as failed;
143 = 128 + SIGTERM, as the `stacx` commands exit when stopped)."""


class WandbTracker:
    """An offline W&B run under `runs/<name>/tracking/wandb/wandb/offline-run-*/`."""

    requires: ClassVar[Requirement] = Requirement("wandb", ("wandb",), "wandb")

    def __init__(
        self,
        run: TrackedRun,
        *,
        project: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        """`project` (default: the run name), `group`, `tags` as W&B has them; `settings`: more
        `wandb.Settings` fields. The mode is always offline."""
        wandb = self.requires.load()
        run.dir.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self._run = wandb.init(
            project=project or run.name,
            id=run.run_id,
            name=run.run_id,
            group=group,
            tags=tags,
            dir=str(run.dir),
            mode="offline",
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, **(settings or {})),
        )
        self._run.define_metric(STEP_METRIC)
        self._run.define_metric("*", step_metric=STEP_METRIC)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({**{k: float(v) for k, v in metrics.items()}, STEP_METRIC: step})

    def log_table(self, name: str, step: int, table: Table) -> None:
        rows = [list(row) for row in table.rows]
        self._run.log({name: self._wandb.Table(columns=list(table.columns), data=rows), STEP_METRIC: step})

    def log_summary(self, step: int, metrics: Mapping[str, float]) -> None:
        """The run's summary: these figures (not the last logged row) and their version."""
        self._run.summary.update({**{k: float(v) for k, v in metrics.items()}, "summary_version": step})

    def finish(self, outcome: Outcome = "finished") -> None:
        """Finish the run with the outcome's exit code. W&B's service process writes the `.wandb`
        file: it is complete once that service stops (`wandb.teardown()`, or this process's exit)."""
        self._run.finish(exit_code=EXIT_CODES[outcome])
