"""TensorBoard: event files under the run (`tensorboard --logdir runs/<name>/tracking/tensorboard`),
one subfolder per run id, so each run of a name is its own run in TensorBoard."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import yaml

from stacx.infra.tracking.protocols import Cell, Outcome, Table, TrackedRun
from stacx.infra.tracking.requirements import Requirement

__all__ = ["TensorBoardTracker", "markdown_table"]


class TensorBoardTracker:
    """TensorBoard event files: figures as scalars, the config and tables as text."""

    requires: ClassVar[Requirement] = Requirement("tensorboard", ("tensorboard",), "tensorboard")

    def __init__(self, run: TrackedRun, *, flush_secs: float = 10.0) -> None:
        """`flush_secs`: how often pending events reach the file (TensorBoard shows them then)."""
        self.requires.load()
        from torch.utils.tensorboard import SummaryWriter

        self.dir = run.dir / run.run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(log_dir=str(self.dir), flush_secs=int(max(1, flush_secs)))

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = yaml.safe_dump(dict(config), sort_keys=False)
        self._writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, float(value), step)

    def log_table(self, name: str, step: int, table: Table) -> None:
        self._writer.add_text(name, markdown_table(table), step)

    def finish(self, outcome: Outcome = "finished") -> None:
        """TensorBoard has no run state: the outcome is a text (`outcome`)."""
        self._writer.add_text("outcome", outcome, 0)
        self._writer.close()


def markdown_table(table: Table) -> str:
    """`table` as a Markdown table (TensorBoard's text plugin renders Markdown)."""
    lines = [_row(table.columns), _row(["---"] * len(table.columns))]
    lines += [_row(row) for row in table.rows]
    return "\n".join(lines)


def _row(cells: Any) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(cell: Cell) -> str:
    return str(cell).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")
