"""Sandbox reuse on the real Docker engine: the next episode in a reused container finds nothing
of the last one (files in every writable mount, /dev/shm, System V IPC, processes that escaped
their exec's process group), gets the mounts' original modes, and works normally."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.backends.docker import LABEL_OWNER
from stacx.sandbox.models import SessionSpec
from stacx.sandbox.sessions import SessionManager

EPISODE = SessionSpec(cpus=0.5, memory_mb=256, lifetime_s=600.0)

DIRTY = r"""
set -e
for d in /tmp /tests /logs /solution "$PWD" /dev/shm; do
  mkdir -p "$d/deep/er" && echo leak > "$d/deep/er/file" && echo leak > "$d/.hidden"
done
chmod 000 /tmp/deep            # a directory its owner locked
chmod 0700 /tmp                # a mount's mode changed
mkfifo /tmp/fifo
ipcmk -M 4096 >/dev/null       # a System V shared memory segment
setsid sleep 1000 </dev/null >/dev/null 2>&1 &   # a process that leaves the exec's group
setsid bash -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
sleep 0.2
echo dirty
"""

CHECK = r"""
for d in /tmp /tests /logs /solution "$PWD" /dev/shm; do
  [ -z "$(ls -A "$d")" ] || echo "left in $d: $(ls -A "$d" | tr '\n' ' ')"
done
echo "tmp mode $(stat -c %a /tmp)"
echo "shm segments $(ipcs -m | grep -c '^0x')"
for p in /proc/[0-9]*; do  # only init and its keep-alive `sleep 86400` may be older than this exec
  read -r _ _ _ ppid _ < "$p/stat" 2>/dev/null || continue
  cmd=$(tr '\0' ' ' < "$p/cmdline")
  [ "$ppid" = 1 ] && [ "$cmd" != "sleep 86400 " ] && echo "survivor: $cmd"
done
echo > "$PWD/works" && echo ok
"""


@pytest.fixture
async def manager(sandbox_image: str, docker_client: Any) -> AsyncIterator[SessionManager]:
    owner = f"test-reuse-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image, reuse_pool_size=2)
    async with SessionManager(config, DockerBackend()) as sessions:
        yield sessions
    left = docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    assert left == [], f"leaked containers: {left}"


async def _settled(manager: SessionManager) -> None:
    for _ in range(600):
        if not manager._returning:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the reset did not finish within 30 s")


def _containers(docker_client: Any, manager: SessionManager) -> list[str]:
    found = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL_OWNER}={manager.config.owner}"}
    )
    return sorted(c.id for c in found)


async def test_a_reused_sandbox_keeps_nothing_of_the_last_episode(
    manager: SessionManager, docker_client: Any
) -> None:
    first = await manager.create(EPISODE)
    dirty = await manager.exec(first.id, DIRTY, timeout_s=30)
    assert dirty.stdout == "dirty\n", dirty
    container = _containers(docker_client, manager)
    await manager.close(first.id)
    await _settled(manager)
    assert manager.reusable == 1 and manager.stats["sandboxes_reset_total"] == 1

    second = await manager.create(EPISODE)
    assert second.id != first.id and manager.stats["sessions_reused_total"] == 1
    assert _containers(docker_client, manager) == container  # the same container, not a new one
    check = await manager.exec(second.id, CHECK, timeout_s=30)
    assert check.stdout == "tmp mode 755\nshm segments 0\nok\n", check
    await manager.close(second.id)


async def test_a_sandbox_whose_processes_cannot_be_killed_is_removed_not_reused(
    manager: SessionManager, docker_client: Any
) -> None:
    info = await manager.create(EPISODE)
    container = docker_client.containers.get(_containers(docker_client, manager)[0])
    await asyncio.to_thread(container.kill)  # a dead sandbox cannot be reset
    await manager.close(info.id)
    await _settled(manager)
    assert manager.reusable == 0 and manager.stats["reset_failures_total"] == 1
    assert _containers(docker_client, manager) == []
