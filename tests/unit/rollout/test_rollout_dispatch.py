"""Dispatch without head-of-line blocking: any waiting episode that fits starts, and a group that
does not fit is bypassed at most `max_bypass` times."""

from __future__ import annotations

import asyncio
import itertools

from stacx.rollout.data import ListTaskSource
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import (
    FakeSession,
    FakeTokenizer,
    MemoryPublisher,
    ScriptedInference,
    python_eval_handler,
)
from stacx.rollout.manager import RolloutManager
from stacx.rollout.protocols import ExecResult
from stacx.rollout.resources import Resources
from stacx.schemas.records import TaskSample

TOOL_THEN_ANSWER = ("<tool_call>print(6*7)</tool_call>", "<answer>42</answer>")


def _policy(context: str, call: int) -> str:
    return TOOL_THEN_ANSWER[1] if "<tool_response>\n" in context else TOOL_THEN_ANSWER[0]


class _GatedSession(FakeSession):
    gate: asyncio.Event | None = None

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        if self.gate is not None:
            await self.gate.wait()
        return await super().exec(command, stdin=stdin, timeout_s=timeout_s)


class _Environments:
    """Records the order sessions open in; episodes of `gated` types wait for `gate`."""

    def __init__(self, gated: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.gate = asyncio.Event()
        self.gated = gated
        self.opened: list[str] = []
        self._ids = itertools.count()

    async def open(
        self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float | None = None
    ) -> FakeSession:
        self.opened.append(task.task_id)
        session = _GatedSession(session_id=f"s{next(self._ids)}", handler=python_eval_handler)
        if task.task_type in self.gated:
            session.gate = self.gate
        return session


def _tasks(*names: str) -> list[TaskSample]:
    return [
        TaskSample(task_id=name, task_type=name.split("-")[0], prompt="q", data='{"answer": 42}')
        for name in names
    ]


def _manager(tasks: list[TaskSample], envs: _Environments, **config) -> RolloutManager:  # type: ignore[no-untyped-def]
    tok = FakeTokenizer()
    return RolloutManager(
        RolloutManager.Config(**config),
        source=ListTaskSource(tasks),
        tokenizer=tok,
        inference=ScriptedInference(tok, _policy),
        publisher=MemoryPublisher(),
        sandbox=envs,
    )


async def _until(predicate, limit_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(wait(), limit_s)


async def test_an_episode_waiting_for_a_scarce_gpu_does_not_hold_back_cpu_episodes() -> None:
    envs = _Environments(gated={"gpu"})
    evaluators = {
        "gpu": Evaluator.Config(episode={"sandboxes": 1, "gpus": 1}),
        "cpu": Evaluator.Config(episode={"sandboxes": 1}),
    }
    tasks = _tasks("gpu-0", "gpu-1", *(f"cpu-{i}" for i in range(6)))
    pool = {"sandboxes": 16, "cpu": 16, "memory_mb": 16384, "generations": 8, "gpus": 1}
    manager = _manager(tasks, envs, evaluators=evaluators, pool=pool)
    run = asyncio.create_task(manager.run())
    done_cpu = lambda: sum(t.task_type == "cpu" for t in manager.publisher.published)  # noqa: E731
    # gpu-0 holds the only GPU until the gate opens; gpu-1 waits for it. The old dispatcher
    # waited for gpu-1's pool and started nothing behind it: no cpu episode ever ran.
    await _until(lambda: done_cpu() == 6)
    assert "gpu-1" not in envs.opened and manager.num_bypassed >= 6
    envs.gate.set()
    summary = await asyncio.wait_for(run, 10)
    assert summary.by_status == {"COMPLETED": 8} and manager.pool.in_use == Resources()


class _OneByOne(_Environments):
    """Every `small` session waits for its own gate, so the test decides when each one ends."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, asyncio.Event] = {}

    async def open(
        self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float | None = None
    ) -> FakeSession:
        session = await super().open(task, cpus=cpus, memory_mb=memory_mb, lifetime_s=lifetime_s)
        if task.task_type == "small":
            session.gate = self.gates[task.task_id] = asyncio.Event()  # type: ignore[attr-defined]
        return session

    def release_all(self) -> None:
        for gate in self.gates.values():
            gate.set()
        self.gates = _AllOpen()  # sessions opened from now on do not wait


class _AllOpen(dict):  # type: ignore[type-arg]
    def __setitem__(self, key: str, gate: asyncio.Event) -> None:
        gate.set()


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def _smalls_ahead_of_big(max_bypass: int) -> int:
    """Two GPUs; smalls need one, big-0 two. Smalls end one at a time, so both GPUs are never
    free at once unless dispatch stops starting smalls. Returns how many smalls started after
    big-0 was taken and before it started (within 12 releases)."""
    envs = _OneByOne()
    evaluators = {
        "big": Evaluator.Config(episode={"sandboxes": 1, "gpus": 2}),
        "small": Evaluator.Config(episode={"sandboxes": 1, "gpus": 1}),
    }
    tasks = _tasks("small-0", "small-1", "big-0", *(f"small-{i}" for i in range(2, 30)))
    pool = {"sandboxes": 16, "cpu": 16, "memory_mb": 16384, "generations": 8, "gpus": 2}
    manager = _manager(tasks, envs, evaluators=evaluators, pool=pool, max_bypass=max_bypass)
    run = asyncio.create_task(manager.run())
    await _settle()
    released: list[str] = []
    while "big-0" not in envs.opened and len(released) < 12:
        oldest = next(t for t in envs.opened if t.startswith("small") and t not in released)
        envs.gates[oldest].set()
        released.append(oldest)
        await _settle()
    opened = list(envs.opened)
    envs.release_all()
    summary = await asyncio.wait_for(run, 10)
    assert summary.by_status == {"COMPLETED": 31} and manager.pool.in_use == Resources()
    smalls = [t for t in opened if t.startswith("small")]
    return (opened.index("big-0") if "big-0" in opened else len(opened)) - 2 if smalls else 0


async def test_a_big_request_is_bypassed_at_most_max_bypass_times() -> None:
    assert await _smalls_ahead_of_big(max_bypass=3) == 3


async def test_without_the_bound_a_stream_of_small_requests_starves_the_big_one() -> None:
    # the control experiment: the same arrivals with the bound lifted; big-0 never starts
    assert await _smalls_ahead_of_big(max_bypass=1000) >= 12
