"""Live terminal view of a running RolloutManager (rich), and a plain one-line summary."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from stacx.rollout.manager import RolloutManager

__all__ = ["live_progress", "metrics_line", "reward_table"]

log = logging.getLogger(__name__)


def metrics_line(metrics: dict[str, Any]) -> str:
    """One log line: version, in flight, done, rate, statuses."""
    statuses = " ".join(f"{k.lower()}={v}" for k, v in sorted(metrics["by_status"].items()))
    return (
        f"v{metrics['policy_version']} in_flight={metrics['in_flight']} "
        f"done={metrics['episodes_done']} ({metrics['episodes_per_s']:.1f}/s) {statuses} "
        f"stalls={metrics['staleness_stalls']}{_gateways_text(metrics, ' ')}{_unread_text(metrics)}"
    )


def _unread_text(metrics: dict[str, Any]) -> str:
    """` STALLED unread_tasks=N` when the worker wants tasks its polls do not return."""
    unread = int(metrics.get("unread_tasks", 0))
    return f" STALLED unread_tasks={unread}" if unread else ""


def _gateways_text(metrics: dict[str, Any], prefix: str) -> str:
    """Per-gateway sessions, `down` for a gateway that failed: ` gateways=a:12,b:down`."""
    gateways = metrics.get("gateways") or {}
    if len(gateways) < 2 and not any(not g["up"] for g in gateways.values()):
        return ""
    parts = [f"{url}:{g['active'] if g['up'] else 'down'}" for url, g in gateways.items()]
    return f"{prefix}gateways=" + ",".join(parts)


def _render(metrics: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="stacx rollout", show_header=False, expand=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    table.add_row("policy version", str(metrics["policy_version"]))
    table.add_row("episodes in flight", str(metrics["in_flight"]))
    table.add_row("episodes done", f"{metrics['episodes_done']} ({metrics['episodes_per_s']:.2f}/s)")
    table.add_row("groups admitted / pending", f"{metrics['groups_admitted']} / {metrics['pending_groups']}")
    table.add_row("status", ", ".join(f"{k}={v}" for k, v in sorted(metrics["by_status"].items())))
    rewards = metrics["mean_reward_by_type"]
    table.add_row("mean reward", ", ".join(f"{t}={r:.3f}" for t, r in sorted(rewards.items())))
    used, cap = metrics["pool_in_use"], metrics["pool_capacity"]
    table.add_row("pool", ", ".join(f"{k} {used[k]:g}/{cap[k]:g}" for k in cap if cap[k]))
    table.add_row("staleness stalls", str(metrics["staleness_stalls"]))
    for url, gateway in (metrics.get("gateways") or {}).items():
        state = (
            f"{gateway['active']} open, {gateway['opened']} opened" if gateway["up"] else gateway["problem"]
        )
        table.add_row(f"gateway {url}", str(state))
    return table


def reward_table(rows: dict[str, tuple[int, float]], title: str = "rewards by task type") -> Any:
    """A rich table of task type -> (episodes, mean reward)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("task type")
    table.add_column("episodes", justify="right")
    table.add_column("mean reward", justify="right")
    for task_type, (count, mean) in sorted(rows.items()):
        table.add_row(task_type, str(count), f"{mean:.3f}")
    return table


@contextlib.asynccontextmanager
async def live_progress(
    manager: RolloutManager, *, enabled: bool = True, refresh_s: float = 0.5, log_every_s: float = 10.0
) -> AsyncIterator[None]:
    """A live table while the body runs; when disabled (no terminal), a log line every
    `log_every_s` seconds instead (0: silent)."""
    if not enabled:
        task = asyncio.create_task(_log_periodically(manager, log_every_s)) if log_every_s else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
        return
    from rich.live import Live

    with Live(_render(manager.metrics()), refresh_per_second=4, transient=False) as live:

        async def refresh() -> None:
            while True:
                await asyncio.sleep(refresh_s)
                live.update(_render(manager.metrics()))

        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            live.update(_render(manager.metrics()))


async def _log_periodically(manager: RolloutManager, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        log.info("rollout: %s", metrics_line(manager.metrics()))
