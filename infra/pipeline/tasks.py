"""The task files of a run: the quickstart's arithmetic plugin (examples/quickstart/arithmetic.py),
and the held-out rows of a Harbor folder or a tasks.jsonl.

`examples/` is not an installed package, so the plugin is loaded from its file next to this
checkout; a clear error says where it was looked for.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from infra.config import resolve_path
from infra.pipeline.config import PipelineSpec
from infra.pipeline.errors import MissingComponentError

__all__ = [
    "REPO_ROOT",
    "TASK_MODULE",
    "harbor_rows",
    "heldout_rows",
    "jsonl_rows",
    "load_task_module",
    "publish_tasks",
    "task_order",
    "task_rows",
    "write_tasks",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this module lives in (`infra/pipeline/` is two levels down)."""
TASK_MODULE = REPO_ROOT / "examples" / "quickstart" / "arithmetic.py"
"""The arithmetic task: problems, demonstrations, reward."""


def load_task_module(path: Path = TASK_MODULE) -> ModuleType:
    """Import the task plugin from its file (cached in sys.modules under a private name)."""
    name = "_stacx_quickstart_task"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise MissingComponentError(
            [
                f"the task module {path} (the quickstart runs from a source checkout: "
                "`git clone` + `make setup`)"
            ]
        )
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def task_rows(problems: list[Any], *, prefix: str, task_type: str) -> list[dict[str, Any]]:
    """`TaskSample` rows (tasks.jsonl) for `problems`."""
    return [
        {
            "task_id": f"{prefix}-{i:05d}",
            "task_type": task_type,
            "prompt": p.prompt,
            "data": json.loads(p.task_data()),
        }
        for i, p in enumerate(problems)
    ]


def write_tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write a tasks.jsonl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def harbor_rows(root: Path) -> list[dict[str, Any]]:
    """TaskSample rows of every Harbor task under `root` (what `stacx tasks import` writes)."""
    from sandbox.tasks import discover_tasks, to_task_sample

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
    from producers import EventProducer
    from rollout.data import task_from_dict

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
