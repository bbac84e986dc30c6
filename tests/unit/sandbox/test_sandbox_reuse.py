"""Sandbox reuse (fake backend): a closed session's sandbox, reset, serves the next session of the
same shape; never a task sandbox; it holds its budget share until evicted; failures remove it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from stacx.sandbox.backends.fake import FakeBackend
from stacx.sandbox.limits import SessionLimits
from stacx.sandbox.models import SessionSpec
from stacx.sandbox.protocols import HostCapacity, SandboxHandle, SandboxSpec
from stacx.sandbox.reuse import ReusePool, shape_key
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import FakeTaskImages

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"
EPISODE = SessionSpec(cpus=0.5, memory_mb=256, lifetime_s=600.0)
HOST = HostCapacity(cpus=2.0, memory_mb=8192, pid_max=32768)


def _manager(backend: FakeBackend, **fields: Any) -> SessionManager:
    config = SessionManager.Config(owner="reuse", **fields)
    return SessionManager(config, backend)


async def _settled(manager: SessionManager) -> None:
    """Wait until the background resets have finished."""
    while manager._returning:
        await asyncio.sleep(0.01)


async def test_a_closed_sandbox_is_reset_and_serves_the_next_session_of_its_shape() -> None:
    backend = FakeBackend()
    async with _manager(backend, reuse_pool_size=4) as manager:
        first = await manager.create(EPISODE)
        await manager.upload(first.id, "notes.txt", b"secret")
        await manager.close(first.id)
        await _settled(manager)
        assert manager.reusable == 1 and backend.resets == [first.id]
        second = await manager.create(EPISODE)
        assert second.id != first.id  # a new session, in the old sandbox
        assert list(backend.sandboxes) == [f"fake-{first.id}"]
        assert backend.sandboxes[f"fake-{first.id}"].files == {}  # reset before it came back
        assert manager.stats["sessions_reused_total"] == 1 and manager.reusable == 0
        assert second.expires_at - second.created_at <= 600.0 + 1.0  # the session's own lifetime
        other = await manager.create(SessionSpec(cpus=1.0, memory_mb=256, lifetime_s=600.0))
        assert f"fake-{other.id}" in backend.sandboxes  # another shape: a new sandbox
    assert backend.sandboxes == {}


async def test_reused_sandboxes_are_labelled_to_outlive_the_sessions_they_serve() -> None:
    backend = FakeBackend()
    async with _manager(backend, reuse_pool_size=1, max_lifetime_s=3600.0) as manager:
        info = await manager.create(EPISODE)
        label = backend.sandboxes[f"fake-{info.id}"].spec.expires_at
        assert label >= info.created_at + 3600.0 - 1.0 and info.expires_at <= info.created_at + 601.0


async def test_without_reuse_every_session_gets_a_new_sandbox_and_it_is_removed() -> None:
    backend = FakeBackend()
    async with _manager(backend) as manager:
        first = await manager.create(EPISODE)
        await manager.close(first.id)
        second = await manager.create(EPISODE)
        assert backend.resets == [] and backend.stopped == [first.id]
        assert list(backend.sandboxes) == [f"fake-{second.id}"]


async def test_task_sandboxes_are_never_reused() -> None:
    backend = FakeBackend()
    config = SessionManager.Config(owner="reuse", reuse_pool_size=4)
    async with SessionManager(config, backend, images=FakeTaskImages()) as manager:  # type: ignore[arg-type]
        task = await manager.create(SessionSpec(task_dir=str(EXAMPLES / "top-ips"), lifetime_s=600.0))
        await manager.close(task.id)
        await _settled(manager)
        assert manager.reusable == 0 and backend.resets == [] and backend.stopped == [task.id]


async def test_a_failed_reset_removes_the_sandbox_and_frees_its_budget() -> None:
    backend = FakeBackend(capacity=HOST)
    backend.reset_ok = False
    async with _manager(backend, reuse_pool_size=4) as manager:
        info = await manager.create(EPISODE)
        await manager.close(info.id)
        await _settled(manager)
        assert manager.reusable == 0 and backend.stopped == [info.id]
        assert manager.stats["reset_failures_total"] == 1
        assert manager.limits.in_use.memory_mb == 0


async def test_the_pool_keeps_at_most_its_size_and_removes_the_rest() -> None:
    backend = FakeBackend()
    async with _manager(backend, reuse_pool_size=2) as manager:
        sessions = [await manager.create(EPISODE) for _ in range(3)]
        for info in sessions:
            await manager.close(info.id)
        await _settled(manager)
        assert manager.reusable == 2 and len(backend.sandboxes) == 2 and len(backend.stopped) == 1


async def test_kept_sandboxes_hold_their_budget_until_a_new_sandbox_needs_it() -> None:
    backend = FakeBackend(capacity=HOST)
    limits = SessionLimits.Config(budget_memory_mb=512)
    async with _manager(backend, reuse_pool_size=4, limits=limits, default_memory_mb=256) as manager:
        a, b = await manager.create(EPISODE), await manager.create(EPISODE)
        await manager.close(a.id)
        await manager.close(b.id)
        await _settled(manager)
        assert manager.limits.in_use.memory_mb == 512 and manager.reusable == 2
        big = await manager.create(SessionSpec(cpus=0.5, memory_mb=300, lifetime_s=600.0))
        assert manager.reusable == 0 and manager.stats["reuse_evicted_total"] == 2
        assert manager.limits.in_use.memory_mb == 300 and set(backend.sandboxes) == {f"fake-{big.id}"}


async def test_the_reaper_keeps_reused_sandboxes_and_evicts_idle_ones() -> None:
    backend = FakeBackend()
    async with _manager(backend, reuse_pool_size=2, reuse_idle_s=3600.0) as manager:
        first = await manager.create(EPISODE)
        await manager.close(first.id)
        await _settled(manager)
        second = await manager.create(EPISODE)  # its sandbox is labelled with the first's id
        assert await manager.reap_once() == 0 and f"fake-{first.id}" in backend.sandboxes
        await manager.close(second.id)
        await _settled(manager)
        assert await manager.reap_once() == 0 and manager.reusable == 1
        manager.config.reuse_idle_s = 0.0
        await manager.reap_once()
        assert manager.reusable == 0 and backend.sandboxes == {}
        assert manager.stats["reuse_evicted_total"] == 1 and manager.limits.in_use.memory_mb == 0


def _handle(name: str) -> SandboxHandle:
    return SandboxHandle(session_id=name, ref=name, workdir="/workspace")


def test_the_pool_hands_out_only_sandboxes_whose_label_outlives_the_session() -> None:
    now = [100.0]
    pool = ReusePool(clock=lambda: now[0])
    key = ("img", "/workspace", 0.5, 256, 64, ())
    pool.put(key, _handle("short"), label_expires_at=1_000.0)
    now[0] = 101.0
    pool.put(key, _handle("long"), label_expires_at=9_000.0)
    assert pool.take(key, until=5_000.0) == (_handle("long"), 9_000.0)
    assert pool.take(key, until=5_000.0) is None
    assert pool.take(("img", "/other", 0.5, 256, 64, ()), until=0.0) is None
    assert pool.pop_oldest() == _handle("short") and len(pool) == 0


def test_the_shape_key_tells_apart_everything_a_container_fixes_at_start() -> None:
    base = dict(session_id="s", owner="o", instance="i", image="img", workdir="/w", cpus=1.0)
    spec = SandboxSpec(**base, memory_mb=256, pids=64, expires_at=0.0)  # type: ignore[arg-type]
    keys = {
        shape_key(spec),
        shape_key(SandboxSpec(**base, memory_mb=512, pids=64, expires_at=0.0)),  # type: ignore[arg-type]
        shape_key(SandboxSpec(**base, memory_mb=256, pids=32, expires_at=0.0)),  # type: ignore[arg-type]
        shape_key(SandboxSpec(**base, memory_mb=256, pids=64, env={"A": "1"}, expires_at=0.0)),  # type: ignore[arg-type]
    }
    assert len(keys) == 4
    assert shape_key(SandboxSpec(**base, memory_mb=256, pids=64, harbor=True, expires_at=0.0)) is None  # type: ignore[arg-type]
