"""DataSource: task groups from a `tasks.jsonl` file, the `stacx.tasks` topic, or a task-source
plug-in (`data.source`: a registered name, `package.module:Factory`, or an entry point in
`stacx.task_sources`).

A task source plug-in is `Factory(**options)` whose object has `train_tasks()` (TaskSample rows
or `TaskSample`s), optionally `heldout_tasks()` (evaluation, never trained on) and
`demonstration(rng, *, skill)` -> `(prompt, segments)` for an SFT warm start: segments alternate
policy text (trained on) and observations (not trained on), as a rollout episode does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
from collections import deque
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
    "KafkaTaskSource",
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


class KafkaTaskSource:
    """Groups from the `stacx.tasks` topic through a consumer group (many workers share it).

    Offsets are committed only after every sample of the group is published (`ack`), so a crashed
    worker's tasks are redelivered to another one. A rebalance re-reads this worker's own
    unfinished tasks from the committed offsets; those already taken here are skipped, not run
    twice. `num_takeovers` counts the rebalances that gave this worker partitions it did not
    have (a peer left the group: its unfinished tasks are re-served here).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        bootstrap_servers: str
        """Kafka bootstrap servers."""
        group_id: str = "stacx-rollout"
        """Consumer group shared by the rollout workers."""
        topic: str = "stacx.tasks"
        """Topic of `TaskSample` events."""
        samples_per_task: int = 1
        """Samples per task: the GRPO group size `n`."""
        poll_timeout_s: float = 0.5
        """How long one poll waits for an event."""
        max_idle_polls: int = 0
        """Return `None` (exhausted) after this many empty polls in a row (0 = never)."""

    def __init__(self, config: Config, consumer: Any = None) -> None:
        self.config = config
        self._consumer = consumer if consumer is not None else self._make_consumer()
        self._idle = 0
        self._pending: dict[tuple[str, int], dict[int, Any]] = {}
        """Per partition: offset -> event, still in flight (committed in offset order only)."""
        self._done: dict[tuple[str, int], dict[int, Any]] = {}
        self._commit_lock = asyncio.Lock()
        self._assigned: set[tuple[str, int]] = set()
        """The partitions of the last assignment (a rebalance hands out the whole set)."""
        self._ever_assigned = False
        self._paused = False
        self._held: deque[Any] = deque()
        """Events a keep-alive poll returned (fetched before the pause took effect): served first."""
        self.num_takeovers = 0
        """Rebalances that assigned this worker partitions it did not have before (not the first)."""

    def _make_consumer(self) -> Any:
        from stacx.consumers import EventConsumer

        return EventConsumer(
            EventConsumer.Config(
                bootstrap_servers=self.config.bootstrap_servers,
                group_id=self.config.group_id,
                topics=[self.config.topic],
            ),
            on_assign=self.on_assign,
        )

    def on_assign(self, partitions: list[tuple[str, int]]) -> None:
        """A new assignment (the consumer's rebalance callback): count a takeover when it holds
        partitions this worker did not have."""
        gained = set(partitions) - self._assigned
        if gained and self._ever_assigned:
            self.num_takeovers += 1
            log.info("tasks of partitions %s re-served here (the group rebalanced)", sorted(gained))
        self._assigned, self._ever_assigned = set(partitions), True

    def keep_alive(self) -> None:
        """Serve the group while no task is wanted (the worker is full, or waits at its staleness
        bound): fetching paused, so nothing new is taken, but a rebalance completes at once
        instead of waiting for this member's next poll: a joining peer starts, a departed
        peer's tasks are re-served here (a takeover), in seconds, not after `max.poll.interval`."""
        if not self._paused:
            self._consumer.pause()
            self._paused = True
        event = self._consumer.poll(0)
        if event is not None:
            self._held.append(event)

    async def next_group(self) -> TaskGroup | None:
        if self._paused:
            await asyncio.to_thread(self._consumer.resume)
            self._paused = False
        while True:
            if self._held:
                event = self._held.popleft()
                if (event.topic, event.partition) not in self._assigned:
                    continue  # a rebalance since moved its partition: the new owner reads it
            else:
                event = await asyncio.to_thread(self._consumer.poll, self.config.poll_timeout_s)
            if event is not None and isinstance(event.value, TaskSample):
                self._idle = 0
                if self._taken_here(event):
                    continue
                ref = f"{event.topic}/{event.partition}/{event.offset}"
                self._pending.setdefault((event.topic, event.partition), {})[event.offset] = event
                return TaskGroup(
                    group_id=group_id_for(event.value.task_id, 0, ref),
                    task=event.value,
                    num_samples=self.config.samples_per_task,
                    source_ref=event,
                )
            self._idle += 1
            if self.config.max_idle_polls and self._idle >= self.config.max_idle_polls:
                return None

    def _taken_here(self, event: Any) -> bool:
        """The task is running here or finished and not committed yet (a rebalance re-read it)."""
        part = (event.topic, event.partition)
        return event.offset in self._pending.get(part, {}) or event.offset in self._done.get(part, {})

    async def ack(self, group: TaskGroup) -> None:
        event = group.source_ref
        part = (event.topic, event.partition)
        self._pending.get(part, {}).pop(event.offset, None)
        self._done.setdefault(part, {})[event.offset] = event
        async with self._commit_lock:  # commits finish in order: a later one never goes backwards
            last = self._committable(part)
            if last is not None:
                await asyncio.to_thread(self._consumer.commit, last)

    def _committable(self, part: tuple[str, int]) -> Any:
        """The highest finished event below every unfinished one of `part` (None: nothing new)."""
        pending, done = self._pending.get(part, {}), self._done.get(part, {})
        low = min(pending) if pending else None
        ready = [offset for offset in done if low is None or offset < low]
        if not ready:
            return None
        last = done[max(ready)]
        for offset in ready:
            del done[offset]
        return last

    async def close(self) -> None:
        await asyncio.to_thread(self._consumer.close)
