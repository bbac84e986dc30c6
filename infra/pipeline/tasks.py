"""The task files of a run: a task source's rows, the held-out rows of a Harbor folder or a
tasks.jsonl, and the run's tasks topic."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stacx.infra.config import resolve_path
from stacx.infra.pipeline.config import PipelineSpec
from stacx.infra.pipeline.errors import PipelineConfigError

__all__ = [
    "harbor_rows",
    "heldout_rows",
    "jsonl_rows",
    "publish_tasks",
    "source_rows",
    "task_order",
    "write_tasks",
]


def source_rows(rows: Iterable[Any], *, where: str) -> list[dict[str, Any]]:
    """JSON rows (tasks.jsonl, task events) of a task source's `TaskSample`s or mappings,
    each checked as a `TaskSample`."""
    from stacx.rollout.data import task_from_dict
    from stacx.rollout.errors import ConfigError
    from stacx.schemas.records import TaskSample

    out = []
    for i, row in enumerate(rows):
        value = dataclasses.asdict(row) if isinstance(row, TaskSample) else dict(row)
        try:
            task_from_dict(value, where=f"{where}: task {i}")
        except ConfigError as exc:
            raise PipelineConfigError(str(exc)) from exc
        out.append(value)
    return out


def write_tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write a tasks.jsonl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def harbor_rows(root: Path) -> list[dict[str, Any]]:
    """TaskSample rows of every Harbor task under `root` (what `stacx tasks import` writes)."""
    from stacx.sandbox.tasks import discover_tasks, to_task_sample

    return [dataclasses.asdict(to_task_sample(task)) for task in discover_tasks(root)]


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a tasks.jsonl."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rows(path: Path) -> list[dict[str, Any]]:
    return jsonl_rows(path) if path.is_file() else harbor_rows(path)


def heldout_rows(spec: PipelineSpec) -> list[dict[str, Any]]:
    """Evaluation rows for harbor, jsonl and topic tasks: `tasks.heldout` when set, else the
    training tasks themselves (a topic has none)."""
    tasks = spec.pipeline.tasks
    chosen = tasks.heldout or tasks.harbor or tasks.jsonl
    return _rows(resolve_path(chosen, spec.base_dir)) if chosen else []


def task_order(rows: list[dict[str, Any]], *, passes: int, seed: int) -> list[dict[str, Any]]:
    """`passes` shuffled passes over `rows` (pass p shuffled with seed + p)."""
    order: list[dict[str, Any]] = []
    for p in range(passes):
        shuffled = list(rows)
        random.Random(seed + p).shuffle(shuffled)
        order += shuffled
    return order


def publish_tasks(bootstrap_servers: str, topic: str, rows: list[dict[str, Any]]) -> int:
    """Publish `rows` as `TaskSample` events (key: task id) and wait for every acknowledgement.

    The rollout service reads them through a consumer group and commits a task only once its
    whole group is published: a restarted rollout service goes on where it stopped."""
    from stacx.producers import EventProducer
    from stacx.rollout.data import task_from_dict

    producer = EventProducer(
        EventProducer.Config(bootstrap_servers=bootstrap_servers, client_id="stacx-run-tasks")
    )
    try:
        for i, row in enumerate(rows):
            producer.publish(topic, task_from_dict(row, where=f"task {i}"), key=row["task_id"])
        remaining = producer.flush(60.0)
    finally:
        producer.close()
    if remaining:
        raise RuntimeError(f"{remaining} task(s) were not acknowledged by Kafka on {topic}")
    return len(rows)
