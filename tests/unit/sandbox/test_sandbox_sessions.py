"""Session lifecycle: limits, expiry, idle timeout, reaper, warm pool, cleanup on stop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from stacx.sandbox.backends.fake import FakeBackend, FakeSandbox
from stacx.sandbox.errors import CapacityExceeded, InvalidSpec, PathRejected, SessionExpired, SessionNotFound
from stacx.sandbox.models import ExecRequest, ExecResult, SessionSpec
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import FakeTaskImages

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"


def _manager(backend: FakeBackend | None = None, **fields: object) -> SessionManager:
    config = SessionManager.Config(owner="unit", **fields)  # type: ignore[arg-type]
    return SessionManager(config, backend or FakeBackend())


async def test_defaults_and_spec_limits_reach_the_backend() -> None:
    backend = FakeBackend()
    async with _manager(backend, default_memory_mb=333) as manager:
        plain = await manager.create()
        custom = await manager.create(SessionSpec(cpus=0.5, memory_mb=64, pids=32, env={"A": "1"}))
        assert plain.memory_mb == 333 and plain.workdir == "/workspace"
        spec = backend.sandboxes[f"fake-{custom.id}"].spec
        assert (spec.cpus, spec.memory_mb, spec.pids, spec.env) == (0.5, 64, 32, {"A": "1"})
        assert spec.owner == "unit" and spec.instance == manager.instance
    assert backend.sandboxes == {}


async def test_image_workdir_is_seeded() -> None:
    backend = FakeBackend(image_workdirs={"task:1": "/app"})
    async with _manager(backend) as manager:
        info = await manager.create(SessionSpec(image="task:1"))
        spec = backend.sandboxes[f"fake-{info.id}"].spec
        assert info.workdir == "/app" and spec.seed_workdir


async def test_lifetime_is_capped() -> None:
    async with _manager(max_lifetime_s=100.0) as manager:
        info = await manager.create(SessionSpec(lifetime_s=10_000.0))
        assert info.expires_at - info.created_at == pytest.approx(100.0, abs=1.0)


async def test_image_and_task_are_exclusive() -> None:
    async with _manager() as manager:
        with pytest.raises(InvalidSpec, match="either image or task_dir"):
            await manager.create(SessionSpec(image="a", task_dir="/x"))


async def test_task_sessions_need_an_image_builder() -> None:
    async with _manager() as manager:
        with pytest.raises(InvalidSpec, match="docker backend"):
            await manager.create(SessionSpec(task_dir=str(EXAMPLES / "write-file")))
        assert manager.list() == []


async def test_capacity_is_enforced() -> None:
    async with _manager(max_sessions=2) as manager:
        await manager.create()
        await manager.create()
        with pytest.raises(CapacityExceeded, match="max_sessions"):
            await manager.create()


async def test_close_removes_sandbox_and_later_use_says_why() -> None:
    backend = FakeBackend()
    async with _manager(backend) as manager:
        info = await manager.create()
        await manager.close(info.id)
        assert backend.stopped == [info.id]
        with pytest.raises(SessionExpired, match="closed by client"):
            await manager.exec(info.id, "true")
        with pytest.raises(SessionNotFound):
            manager.get("sb-never")


async def test_expired_and_idle_sessions_are_reaped() -> None:
    backend = FakeBackend()
    async with _manager(backend) as manager:
        old = await manager.create(SessionSpec(lifetime_s=0.05))
        idle = await manager.create(SessionSpec(idle_timeout_s=0.05))
        fresh = await manager.create()
        await asyncio.sleep(0.1)
        assert await manager.reap_once() == 2
        assert [s.id for s in manager.list()] == [fresh.id]
        with pytest.raises(SessionExpired, match="maximum lifetime"):
            manager.get(old.id)
        with pytest.raises(SessionExpired, match="idle timeout"):
            manager.get(idle.id)


async def test_busy_session_is_not_idle() -> None:
    release = asyncio.Event()

    async def slow(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        await release.wait()
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0)

    async with _manager(FakeBackend(slow)) as manager:
        info = await manager.create(SessionSpec(idle_timeout_s=0.01))
        running = asyncio.create_task(manager.exec(info.id, "sleep"))
        await asyncio.sleep(0.05)
        assert await manager.reap_once() == 0
        release.set()
        assert (await running).ok
        assert manager.get(info.id).last_used_at >= info.last_used_at


async def test_startup_reaps_leftovers_of_same_owner_only() -> None:
    backend = FakeBackend()
    future = time.time() + 3600
    backend.orphans = {"a": ("unit", future), "b": ("other", future), "c": ("other", 1.0)}
    async with _manager(backend) as manager:
        assert manager.stats["reaped_total"] == 2
        assert set(backend.orphans) == {"b"}


async def test_periodic_reaper_removes_unknown_sandboxes() -> None:
    backend = FakeBackend()
    async with _manager(backend, reap_interval_s=0.02) as manager:
        info = await manager.create()
        backend.orphans["left"] = ("unit", time.time() + 3600)
        await asyncio.sleep(0.1)
        assert "left" not in backend.orphans
        assert manager.get(info.id).id == info.id


async def test_stop_closes_every_session() -> None:
    backend = FakeBackend()
    manager = _manager(backend)
    await manager.start()
    ids = {(await manager.create()).id for _ in range(3)}
    await manager.stop()
    assert set(backend.stopped) == ids and backend.sandboxes == {}


async def test_warm_pool_serves_plain_sessions_and_refills() -> None:
    backend = FakeBackend()
    async with _manager(backend, warm_pool_size=2) as manager:
        for _ in range(50):
            if manager.warm == 2:
                break
            await asyncio.sleep(0.01)
        pooled = set(backend.sandboxes)
        info = await manager.create(SessionSpec(env={"K": "v"}))
        assert f"fake-{info.id}" in pooled and manager.stats["pool_hits_total"] == 1
        custom = await manager.create(SessionSpec(memory_mb=64))
        assert f"fake-{custom.id}" not in pooled
        await asyncio.sleep(0.05)
        assert len(backend.sandboxes) == 4
    assert backend.sandboxes == {}


async def test_output_cap_applies() -> None:
    def loud(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        return ExecResult(exit_code=0, stdout="x" * 100, stderr="", duration_s=0.0)

    async with _manager(FakeBackend(loud), max_output_bytes=10) as manager:
        info = await manager.create()
        result = await manager.exec(info.id, "yes", max_output_bytes=1000)
        assert result.stdout == "x" * 10 and result.truncated


async def test_task_session_uses_task_image_and_limits() -> None:
    images = FakeTaskImages()
    backend = FakeBackend(image_workdirs={})
    manager = SessionManager(SessionManager.Config(owner="unit"), backend, images=images)  # type: ignore[arg-type]
    async with manager:
        info = await manager.create(SessionSpec(task_dir=str(EXAMPLES / "top-ips")))
        spec = backend.sandboxes[f"fake-{info.id}"].spec
        assert images.built == ["stacx/top-ips"] and info.task_name == "stacx/top-ips"
        assert spec.image.startswith("stacx-task/stacx-top-ips:") and spec.memory_mb == 512
        assert manager.task(info.id) is not None
        # Harbor semantics: the image's user and file system, tools mounted, image notes reported
        assert spec.harbor and info.harbor and spec.volumes == {"tools-vol": "/opt/stacx-tools"}
        assert spec.workdir == "/" and not spec.seed_workdir
        assert "FROM x -> y" in info.warnings


async def test_task_session_says_when_the_verifier_tools_are_missing() -> None:
    backend = FakeBackend(image_workdirs={})
    images = FakeTaskImages(tools_volume=None)
    async with SessionManager(SessionManager.Config(owner="unit"), backend, images=images) as manager:  # type: ignore[arg-type]
        info = await manager.create(SessionSpec(task_dir=str(EXAMPLES / "top-ips")))
        spec = backend.sandboxes[f"fake-{info.id}"].spec
        assert spec.volumes == {}
        assert any("stacx tasks images build" in w for w in info.warnings)


async def test_harbor_session_accepts_any_absolute_path() -> None:
    backend = FakeBackend(image_workdirs={})
    async with SessionManager(
        SessionManager.Config(owner="unit"), backend, images=FakeTaskImages()
    ) as manager:  # type: ignore[arg-type]
        harbor = await manager.create(SessionSpec(task_dir=str(EXAMPLES / "top-ips")))
        await manager.upload(harbor.id, "/etc/task-data/x.txt", b"x")
        plain = await manager.create(SessionSpec())
        with pytest.raises(PathRejected):
            await manager.upload(plain.id, "/etc/task-data/x.txt", b"x")


class _SlowStart(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def start(self, spec):  # type: ignore[no-untyped-def]
        await self.release.wait()
        return await super().start(spec)


async def test_create_cancelled_mid_start_leaves_nothing() -> None:
    backend = _SlowStart()
    async with _manager(backend) as manager:
        creating = asyncio.create_task(manager.create())
        await asyncio.sleep(0.02)
        creating.cancel()
        backend.release.set()
        with pytest.raises(asyncio.CancelledError):
            await creating
        for _ in range(50):
            if backend.stopped:
                break
            await asyncio.sleep(0.01)
        assert backend.sandboxes == {} and len(backend.stopped) == 1 and manager.list() == []


async def test_stop_during_pool_fill_leaves_nothing() -> None:
    backend = _SlowStart()
    manager = _manager(backend, warm_pool_size=3)
    await manager.start()
    await asyncio.sleep(0.02)
    stopping = asyncio.create_task(manager.stop())
    await asyncio.sleep(0.02)
    backend.release.set()
    await stopping
    assert backend.sandboxes == {} and len(backend.stopped) == 3


async def test_task_dir_outside_allowed_roots_is_refused(tmp_path: Path) -> None:
    manager = SessionManager(
        SessionManager.Config(owner="unit", allowed_task_roots=(str(tmp_path),)),
        FakeBackend(),
        images=FakeTaskImages(),  # type: ignore[arg-type]
    )
    async with manager:
        with pytest.raises(InvalidSpec, match="allowed task roots"):
            await manager.create(SessionSpec(task_dir=str(EXAMPLES / "write-file")))
        with pytest.raises(InvalidSpec, match="allowed task roots"):
            await manager.create(SessionSpec(task_dir=f"{tmp_path}/../{EXAMPLES.name}"))
