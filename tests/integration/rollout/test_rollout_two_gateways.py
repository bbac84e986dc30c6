"""Rollout over two real sandbox gateways (`stacx gateway --backend process`, own processes on
127.0.0.1); one is killed mid-run. Its running episodes end FAILED with the reason, every later
episode goes to the survivor, and the per-gateway load says which one died."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from stacx.rollout.data import ListTaskSource
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.fakes import FakeTokenizer, MemoryPublisher, ScriptedInference
from stacx.rollout.gateways import GatewayEnvironments
from stacx.rollout.manager import RolloutManager
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.testing import gateway_process
from stacx.schemas.records import TaskSample, TrajectoryStatus

TOKEN = "two-gateways"
STEPS = 3


def _gateway(owner: str) -> AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    args = ("--backend", "process", "--owner", owner, "--max-sessions", "64")
    return gateway_process(*args, token=TOKEN, start_timeout_s=60, stop_timeout_s=60)


def _policy(context: str, call: int) -> str:
    if context.count("<tool_response>\n") >= STEPS:
        return "<answer>42</answer>"
    return "<tool_call>import time; time.sleep(0.2); print(6*7)</tool_call>"


class _Watched:
    """Gateway A's client, counting execs in flight and sessions created after the kill."""

    def __init__(self, client: SandboxClient) -> None:
        self.client = client
        self.config = client.config
        self.execs_in_flight = 0
        self.killed = False
        self.created_after_kill = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    async def exec(self, *args: object, **kwargs: object) -> object:
        self.execs_in_flight += 1
        try:
            return await self.client.exec(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            self.execs_in_flight -= 1

    async def create_session(self, **spec: object) -> object:
        asked_after_kill = self.killed
        info = await self.client.create_session(**spec)
        self.created_after_kill += asked_after_kill
        return info


def _client(url: str) -> SandboxClient:
    return SandboxClient(SandboxClient.Config(base_url=url, token=TOKEN, max_retries=1, retry_backoff_s=0.05))


async def _until(predicate, limit_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_killing_one_of_two_gateways_mid_run() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail("the process backend needs bubblewrap: `stacx infra up` installs it", pytrace=False)
    owners = [f"it-two-gw-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    try:
        await _two_gateways(owners)
    finally:
        _reap(owners[0])  # what the killed gateway left behind


async def _two_gateways(owners: list[str]) -> None:
    num_tasks = 40
    with _gateway(owners[0]) as (url_a, process_a), _gateway(owners[1]) as (url_b, _):
        watched = _Watched(_client(url_a))
        clients = [watched.client, _client(url_b)]
        envs = GatewayEnvironments([watched, clients[1]], GatewayEnvironments.Config(down_for_s=3600))
        tok = FakeTokenizer()
        tasks = [
            TaskSample(task_id=f"t{i}", task_type="math", prompt=f"q{i}", data='{"answer": 42}')
            for i in range(num_tasks)
        ]
        evaluator = Evaluator.Config(scaffold="retool", max_turns=8, step_timeout_s=30, episode_timeout_s=120)
        manager = RolloutManager(
            RolloutManager.Config(max_concurrent_episodes=8, evaluators={"default": evaluator}),
            source=ListTaskSource(tasks),
            tokenizer=tok,
            inference=ScriptedInference(tok, _policy),
            publisher=MemoryPublisher(),
            sandbox=envs,
        )
        run = asyncio.create_task(manager.run())
        load = envs.load
        await _until(lambda: manager.summary.num_episodes >= 6 and watched.execs_in_flight >= 1)
        process_a.kill()  # SIGKILL mid-exec: no goodbye, connections refused from now on
        process_a.wait()
        watched.killed = True
        summary = await asyncio.wait_for(run, 300)
        final = load()
        published = manager.publisher.published  # type: ignore[attr-defined]
        for client in clients:
            await client.aclose()
        assert await _leftovers(url_b) == 0

    assert summary.num_episodes == num_tasks
    failed = [t for t in published if t.status is TrajectoryStatus.FAILED]
    completed = [t for t in published if t.status is TrajectoryStatus.COMPLETED]
    # an episode in the middle of a step on the dead gateway ends FAILED with the reason ...
    assert failed and all(url_a in (t.error or "") for t in failed), [t.error for t in failed]
    assert len(completed) == num_tasks - len(failed)
    # ... and no session was started there after the kill: new episodes went to the survivor
    assert watched.created_after_kill == 0
    assert final[url_a]["up"] is False and final[url_a]["active"] == 0
    assert final[url_b]["up"] is True and final[url_b]["active"] == 0 and final[url_b]["failures"] == 0
    assert final[url_a]["opened"] + final[url_b]["opened"] == num_tasks
    assert all(int(t.metadata["num_tool_calls"]) == STEPS for t in completed)


async def _leftovers(url: str) -> int:
    async with _client(url) as client:
        return len(await client.list_sessions())


def _reap(owner: str) -> None:
    """Remove what the killed gateway left in the process backend's folder."""
    import shutil

    from stacx.sandbox.backends import ProcessBackend

    shutil.rmtree(Path(ProcessBackend().config.root, owner), ignore_errors=True)
