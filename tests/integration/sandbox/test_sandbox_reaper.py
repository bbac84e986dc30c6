"""Nothing leaks: a crashed gateway's containers are reaped by label, expired ones by anyone."""

from __future__ import annotations

import asyncio
import time
import uuid

from stacx.sandbox.backends import DockerBackend, ProcessBackend
from stacx.sandbox.backends.docker import LABEL_OWNER
from stacx.sandbox.models import SessionSpec
from stacx.sandbox.protocols import SandboxSpec
from stacx.sandbox.sessions import SessionManager


def _containers(docker_client, owner: str) -> list:  # type: ignore[no-untyped-def]
    return docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})


async def test_restart_reaps_what_a_crashed_gateway_left(sandbox_image: str, docker_client) -> None:  # type: ignore[no-untyped-def]
    owner = f"test-reaper-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image)
    crashed = SessionManager(config, DockerBackend())
    backend = DockerBackend()
    try:
        await crashed.start()
        await crashed.create()
        await crashed.create()
        assert len(_containers(docker_client, owner)) == 2
        # the first gateway "crashes" (never stops); a new one with the same owner starts
        restarted = SessionManager(config, backend)
        async with restarted:
            assert restarted.stats["reaped_total"] == 2
            kept = await restarted.create()
            assert [c.labels["stacx.sandbox.session"] for c in _containers(docker_client, owner)] == [kept.id]
        assert _containers(docker_client, owner) == []
    finally:
        await crashed.stop()
        await backend.close()
        for container in _containers(docker_client, owner):
            container.remove(force=True, v=True)


async def test_expired_sandboxes_are_reaped_whoever_owns_them(sandbox_image: str, docker_client) -> None:  # type: ignore[no-untyped-def]
    owner = f"test-expired-{uuid.uuid4().hex[:8]}"
    backend = DockerBackend()
    spec = SandboxSpec(
        session_id="sb-expired",
        owner=owner,
        instance="gone",
        image=sandbox_image,
        workdir="/workspace",
        cpus=0.5,
        memory_mb=64,
        pids=16,
        expires_at=time.time() - 1,
    )
    try:
        await backend.start(spec)
        assert len(_containers(docker_client, owner)) == 1
        # any gateway's reaper may remove an expired sandbox, so count nothing: it must be gone
        await backend.reap(owner="someone-else", keep=set())
        assert _containers(docker_client, owner) == []
    finally:
        for container in _containers(docker_client, owner):
            container.remove(force=True, v=True)
        await backend.close()


async def test_warm_pool_hands_out_started_containers(sandbox_image: str, docker_client) -> None:  # type: ignore[no-untyped-def]
    owner = f"test-pool-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image, warm_pool_size=2)
    backend = DockerBackend()
    try:
        async with SessionManager(config, backend) as manager:
            for _ in range(300):
                if manager.warm == 2:
                    break
                await asyncio.sleep(0.1)
            pooled = {c.labels["stacx.sandbox.session"] for c in _containers(docker_client, owner)}
            info = await manager.create(SessionSpec(env={"GREETING": "hi"}))
            assert info.id in pooled and manager.stats["pool_hits_total"] == 1
            result = await manager.exec(info.id, 'echo "$GREETING" && id -u')
            assert result.stdout == "hi\n1000\n"
        assert _containers(docker_client, owner) == []
    finally:
        for container in _containers(docker_client, owner):
            container.remove(force=True, v=True)
        await backend.close()


async def test_process_backend_reaps_by_owner_and_expiry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    backend = ProcessBackend(ProcessBackend.Config(root=str(tmp_path)))

    def spec(session_id: str, owner: str, expires_at: float) -> SandboxSpec:
        return SandboxSpec(
            session_id=session_id,
            owner=owner,
            instance="i",
            image="ignored",
            workdir="/workspace",
            cpus=1,
            memory_mb=256,
            pids=64,
            expires_at=expires_at,
        )

    future = time.time() + 3600
    await backend.start(spec("keep", "me", future))
    await backend.start(spec("orphan", "me", future))
    await backend.start(spec("theirs", "other", future))
    await backend.start(spec("stale", "other", time.time() - 1))
    assert await backend.reap(owner="me", keep={"keep"}) == 2
    assert sorted(p.name for p in tmp_path.glob("*/*")) == ["keep", "theirs"]
