"""The run's outputs: `report.json` and the reward-curve PNG (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from stacx.infra.pipeline.monitor import RunMetrics

__all__ = ["json_safe", "plot_curve", "write_report"]


def write_report(path: Path, report: dict[str, Any]) -> Path:
    """Write `report` as strict JSON: a non-finite number (NaN, inf: no JSON value) is null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(json_safe(report), indent=2, sort_keys=False, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (containers walked, keys kept)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def plot_curve(path: Path, metrics: RunMetrics, *, title: str, min_episodes: int = 16) -> Path:
    """Mean training reward and tool-use rate per policy version, held-out success on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    # versions cut short by the end of the run have a handful of episodes: too noisy to plot
    curve = [p for p in metrics.reward_curve() if p["episodes"] >= min_episodes]
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=120)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if curve:
        versions = [p["version"] for p in curve]
        ax.plot(versions, [p["mean_reward"] for p in curve], "o-", label="mean rollout reward")
        ax.plot(versions, [p["tool_rate"] for p in curve], "s--", alpha=0.6, label="rollout tool-use rate")
    if metrics.evals:
        ax.plot(
            [e.version for e in metrics.evals],
            [e.success for e in metrics.evals],
            "D-",
            color="black",
            label="held-out success",
        )
    ax.set_xlabel("policy version (GRPO steps)")
    ax.set_ylabel("rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:  # a run stopped before any point has nothing to label
        ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
