"""A pipeline spec cut down to a short end-to-end run on free ports (the e2e smoke tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ports import free_port
from run_names import run_name


def shrink(
    spec: Any,
    runs_dir: Path,
    *,
    steps: int,
    timeout_s: float,
    samples_per_task: int,
    max_concurrent_episodes: int,
    group_size: int,
    batch_size: int = 2,
    groups_per_version: int = 2,
) -> Any:
    """`spec` with a fresh run name under `runs_dir`, `steps` policy versions, no live view, one
    final held-out sample per problem, its own ports, no warm sandboxes, and small groups."""
    cfg = spec.pipeline
    cfg.name, cfg.runs_dir, cfg.steps, cfg.live = run_name("e2e"), str(runs_dir), steps, False
    cfg.timeout_s = timeout_s
    cfg.evaluation.final_samples_per_problem = 1
    spec.gateway["port"] = free_port()
    spec.gateway.setdefault("sessions", {})["warm_pool_size"] = 0
    spec.inference.setdefault("server", {})["port"] = free_port()
    spec.rollout["data"]["samples_per_task"] = samples_per_task
    spec.rollout["manager"]["train_groups_per_version"] = groups_per_version
    spec.rollout["manager"]["max_concurrent_episodes"] = max_concurrent_episodes
    spec.assembler["grouping"]["group_size"] = group_size
    spec.assembler["mixture"]["batch_size"] = batch_size
    return spec
