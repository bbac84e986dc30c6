"""DataSource: task groups from a `tasks.jsonl` file or a task-source plug-in (`data.source`: a
registered name, `package.module:Factory`, or an entry point in `stacx.task_sources`); the
`stacx.tasks` topic is `stacx.rollout.task_stream`.

A task source plug-in is `Factory(**options)` whose object has `train_tasks()` (TaskSample rows
or `TaskSample`s), optionally `heldout_tasks()` (evaluation, never trained on) and
`demonstration(rng, *, skill)` -> `(prompt, segments)` for an SFT warm start: segments alternate
policy text (trained on) and observations (not trained on), as a rollout episode does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stacx.rollout.errors import ConfigError
from stacx.rollout.protocols import TaskGroup
from stacx.schemas.plugins import PluginError, Registry
from stacx.schemas.records import TaskSample

__all__ = [
    "JsonlTaskSource",
    "ListTaskSource",
    "TASK_SOURCES",
    "build_task_set",
    "group_id_for",
    "load_tasks_jsonl",
    "task_from_dict",
]

log = logging.getLogger(__name__)

_TASK_FIELDS = {f.name for f in dataclasses.fields(TaskSample)}


def group_id_for(task_id: str, epoch: int, salt: str = "") -> str:
    """Deterministic group id: the same task in the same epoch of the same run gets the same id."""
    return hashlib.sha256(f"{task_id}\x1f{epoch}\x1f{salt}".encode()).hexdigest()[:24]


def task_from_dict(row: Mapping[str, Any], *, where: str) -> TaskSample:
    """A `TaskSample` from a JSON object; `data` may be an object (it is JSON-encoded)."""
    unknown = sorted(set(row) - _TASK_FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; TaskSample has {sorted(_TASK_FIELDS)}")
    missing = [name for name in ("task_id", "task_type", "prompt") if name not in row]
    if missing:
        raise ConfigError(f"{where}: missing required field(s) {missing}")
    values = dict(row)
    if not isinstance(values.get("data", "{}"), str):
        values["data"] = json.dumps(values["data"])
    values["metadata"] = {str(k): str(v) for k, v in dict(values.get("metadata") or {}).items()}
    return TaskSample(**values)


def load_tasks_jsonl(path: str | Path) -> list[TaskSample]:
    """Read every row of a tasks.jsonl; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"tasks file {path} does not exist; set data.path to a tasks.jsonl")
    tasks: list[TaskSample] = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
        tasks.append(task_from_dict(row, where=f"{path}:{line_no}"))
    if not tasks:
        raise ConfigError(f"{path} holds no tasks")
    return tasks


def _check_source(factory: Any) -> str | None:
    return None if callable(factory) else f"is a {type(factory).__name__}, not a task-source factory"


TASK_SOURCES: Registry[Any] = Registry("task_sources", what="task source", check=_check_source)
"""Task-source factories by name: `Factory(**options)` with `train_tasks()` (see the docstring)."""


class _JsonlTasks:
    """The rows of a tasks.jsonl (`options: {path: ...}`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def train_tasks(self) -> list[TaskSample]:
        return load_tasks_jsonl(self.path)


TASK_SOURCES.add("jsonl", _JsonlTasks, origin="builtin (stacx.rollout.data)")


def build_task_set(ref: str, options: Mapping[str, Any] | None = None) -> Any:
    """The task source `ref` names, built with `options`; `ConfigError` with one line otherwise."""
    try:
        task_set = TASK_SOURCES.build(ref, **dict(options or {}))
    except PluginError as exc:
        raise ConfigError(str(exc)) from exc
    if not callable(getattr(task_set, "train_tasks", None)):
        raise ConfigError(f"{ref!r}: the task source it built has no train_tasks() method")
    return task_set


def task_samples(rows: Any, *, where: str) -> list[TaskSample]:
    """`TaskSample`s of a task source's rows (mappings or TaskSamples)."""
    return [
        row if isinstance(row, TaskSample) else task_from_dict(row, where=f"{where}: task {i}")
        for i, row in enumerate(rows)
    ]


def row_problems(rows: Any, *, where: str) -> list[tuple[int, str]]:
    """(1-based row number, the problem) of every row of a task source that is no task."""
    problems = []
    for number, row in enumerate(rows, start=1):
        if isinstance(row, TaskSample):
            continue
        if not isinstance(row, Mapping):
            problems.append((number, f"{where}: task {number - 1}: a {type(row).__name__}, not a mapping"))
            continue
        try:
            task_from_dict(row, where=f"{where}: task {number - 1}")
        except (ConfigError, TypeError, ValueError) as exc:
            problems.append((number, str(exc).splitlines()[0]))
    return problems


class ListTaskSource:
    """Groups from an in-memory list of tasks: `epochs` passes, shuffled with `seed` per epoch."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        samples_per_task: int = 1
        """Samples per task: the GRPO group size `n`."""
        epochs: int = 1
        """Passes over the tasks (0 = forever)."""
        shuffle: bool = False
        """Shuffle the order in every epoch."""
        seed: int = 0
        """Shuffle seed (epoch e uses seed + e), also salts group ids."""

        def __post_init__(self) -> None:
            if self.samples_per_task < 1:
                raise ConfigError(f"data.samples_per_task = {self.samples_per_task}; use >= 1")
            if self.epochs < 0:
                raise ConfigError(f"data.epochs = {self.epochs}; use >= 0 (0 = forever)")

    def __init__(self, tasks: Sequence[TaskSample], config: Config | None = None) -> None:
        if not tasks:
            raise ConfigError("the task list is empty")
        self.config = config or ListTaskSource.Config()
        self._tasks = list(tasks)
        self._iter = self._groups()

    def _order(self, epoch: int) -> list[TaskSample]:
        order = list(self._tasks)
        if self.config.shuffle:
            random.Random(self.config.seed + epoch).shuffle(order)
        return order

    def _groups(self) -> Iterator[TaskGroup]:
        epoch = 0
        while self.config.epochs == 0 or epoch < self.config.epochs:
            for task in self._order(epoch):
                yield TaskGroup(
                    group_id=group_id_for(task.task_id, epoch, str(self.config.seed)),
                    task=task,
                    num_samples=self.config.samples_per_task,
                    epoch=epoch,
                )
            epoch += 1

    async def next_group(self) -> TaskGroup | None:
        return next(self._iter, None)

    async def ack(self, group: TaskGroup) -> None:
        return None

    async def close(self) -> None:
        return None


class JsonlTaskSource(ListTaskSource):
    """Groups from a `tasks.jsonl` file of `TaskSample` rows."""

    def __init__(self, path: str | Path, config: ListTaskSource.Config | None = None) -> None:
        super().__init__(load_tasks_jsonl(path), config)
        self.path = Path(path)
