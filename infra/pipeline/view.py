"""The live `rich` view of a running pipeline."""

from __future__ import annotations

from typing import Any

from stacx.infra.pipeline.monitor import RunMetrics

__all__ = ["render", "status_line"]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rows(metrics: RunMetrics, target_steps: int) -> list[tuple[str, str]]:
    latest = metrics.latest_training_stats()
    heldout = metrics.evals[-1] if metrics.evals else None
    first = metrics.evals[0] if metrics.evals else None
    rows = [
        ("stage", metrics.stage),
        ("elapsed", f"{metrics.elapsed():.0f} s"),
        ("policy version", f"{metrics.policy_version} / {target_steps}   (server: {metrics.server_version})"),
        (
            "mean reward",
            "-"
            if latest is None
            else f"{latest[1].mean_reward:.2f}  (v{latest[0]}, {latest[1].num} episodes)",
        ),
        ("tool-use rate", "-" if latest is None else f"{latest[1].tool_rate:.2f}"),
        (
            "held-out success",
            "-"
            if heldout is None
            else f"{heldout.success:.2f} at v{heldout.version}"
            + ("" if first is None or first is heldout else f"  (start {first.success:.2f})"),
        ),
        ("staleness", f"{_fmt(metrics.mean_staleness())} versions (mean, recent)"),
        (
            "events/s",
            f"{_fmt(metrics.events_per_s(), 1)} trajectories/s   "
            f"({metrics.num_trajectories} trajectories, {metrics.num_batches} batches)",
        ),
    ]
    return rows


def render(metrics: RunMetrics, *, title: str, target_steps: int) -> Any:
    """A rich renderable (a two-column table) of the current metrics."""
    from rich.table import Table

    table = Table(title=title, show_header=False, expand=False, min_width=64)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for name, value in _rows(metrics, target_steps):
        table.add_row(name, value)
    return table


def status_line(metrics: RunMetrics, *, target_steps: int) -> str:
    """The same figures on one line (for logs and non-terminal output)."""
    return " | ".join(f"{k}: {v}" for k, v in _rows(metrics, target_steps))
