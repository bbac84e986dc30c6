"""An exec is its whole process tree (docker backend): a fork bomb and `cmd &` end at the exec's
timeout, reported as timed out, and the sandbox is idle again within seconds; a daemon an exec
started on purpose runs on, is listed and held to the sandbox's CPU limit, and a cancelled exec
takes it with it; a container that dies is reported as such; filling /tmp fails the write, not
the sandbox; limits over the operator's maxima are refused."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.backends.docker import LABEL_OWNER, LABEL_SESSION
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import LimitExceeded, SandboxStopped
from stacx.sandbox.limits import SessionLimits
from stacx.sandbox.models import ExecRequest
from stacx.sandbox.protocols import SandboxSpec
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import serve_gateway

TOKEN = "exec-tree-token"
IDLE_CPU_FRACTION = 0.05
"""Below this share of one core the sandbox counts as idle."""


@pytest.fixture(scope="module")
def owner() -> str:
    return f"test-exec-tree-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def url(sandbox_image: str, owner: str, docker_client: Any) -> Iterator[str]:
    limits = SessionLimits.Config(max_pids=512)
    config = SessionManager.Config(owner=owner, default_image=sandbox_image, limits=limits)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config) as base:
        yield base
    left = docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    assert left == [], f"leaked containers: {left}"


@pytest.fixture
async def client(url: str) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(SandboxClient.Config(base_url=url, token=TOKEN)) as c:
        yield c


def _container(docker_client: Any, owner: str, session_id: str) -> Any:
    (container,) = docker_client.containers.list(
        all=True, filters={"label": [f"{LABEL_OWNER}={owner}", f"{LABEL_SESSION}={session_id}"]}
    )
    return container


def _usage(container: Any) -> tuple[float, int]:
    """(CPU seconds used so far, processes now) of the container's cgroup."""
    stats = container.stats(stream=False)
    return stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9, int(stats["pids_stats"]["current"])


def _seconds_until_idle(container: Any, limit_s: float = 30.0) -> float:
    """Seconds until the container uses under IDLE_CPU_FRACTION of a core with <= 3 processes."""
    started = time.monotonic()
    cpu, _ = _usage(container)
    while time.monotonic() - started < limit_s:
        time.sleep(1.0)
        now, processes = _usage(container)
        if now - cpu < IDLE_CPU_FRACTION and processes <= 3:
            return time.monotonic() - started
        cpu = now
    raise AssertionError(f"the sandbox still burns CPU {limit_s} s after its exec ended")


async def test_fork_bomb_times_out_and_the_sandbox_is_idle_within_seconds(
    client: SandboxClient, docker_client: Any, owner: str
) -> None:
    async with client.session(pids=128) as bomb:
        started = time.monotonic()
        # The classic bomb alone can die out by itself on a loaded machine (its shells give up
        # when fork keeps failing at the pids limit); the sleeper keeps the tree alive until
        # the exec's timeout ends it, so the timeout path is what is tested, every run.
        result = await client.exec(bomb.id, "sleep 600 & :(){ :|:& };:", timeout_s=4)
        assert result.timed_out and result.exit_code == 137, result
        assert time.monotonic() - started < 4 + 10
        container = _container(docker_client, owner, bomb.id)
        idle_after = await asyncio.to_thread(_seconds_until_idle, container)
        assert idle_after <= 5.0
        assert (await client.exec(bomb.id, "echo alive", timeout_s=30)).stdout == "alive\n"


async def test_a_background_child_ends_with_its_exec(client: SandboxClient) -> None:
    async with client.session() as info:
        result = await client.exec(info.id, "sleep 300 & echo $!", timeout_s=2)
        assert result.timed_out and result.exit_code == 137  # not exit 0 with `sleep` left running
        pid = result.stdout.split()[0]
        gone = await client.exec(info.id, f"kill -0 {pid} 2>/dev/null && echo alive || echo gone")
        assert gone.stdout == "gone\n"
        waited = await client.exec(info.id, "(sleep 0.5; echo late) & echo early", timeout_s=30)
        assert waited.ok and waited.stdout == "early\nlate\n" and not waited.timed_out


def _cores_used(container: Any, over_s: float = 3.0) -> float:
    """Cores the container's cgroup used on average over `over_s` seconds."""
    cpu, _ = _usage(container)
    started = time.monotonic()
    time.sleep(over_s)
    now, _ = _usage(container)
    return (now - cpu) / (time.monotonic() - started)


async def test_a_daemon_of_a_finished_exec_runs_on_listed_and_held_to_the_cpu_limit(
    client: SandboxClient, docker_client: Any, owner: str
) -> None:
    async with client.session(cpus=0.5) as info:
        daemon = "setsid -f sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1; echo started"
        result = await client.exec(info.id, daemon, timeout_s=30)
        assert result.ok and result.stdout == "started\n" and result.stderr == "", result
        [line] = result.left_running
        pid, command = line.split(" ", 1)
        assert command == "sh -c while :; do :; done"
        later = await client.exec(info.id, f"kill -0 {pid} && echo running", timeout_s=30)
        assert later.stdout == "running\n" and later.left_running == []
        cores = await asyncio.to_thread(_cores_used, _container(docker_client, owner, info.id))
        # it runs (some CPU even on a loaded host) and never past its sandbox's quota
        assert IDLE_CPU_FRACTION < cores <= 0.5 * 1.15, (
            f"the daemon used {cores:.2f} cores under a 0.5-core limit"
        )


async def test_a_cancelled_exec_takes_the_daemons_it_started_with_it(sandbox_image: str, owner: str) -> None:
    backend = DockerBackend()
    spec = SandboxSpec(
        session_id=f"cancel-{uuid.uuid4().hex[:8]}",
        owner=owner,
        instance="test",
        image=sandbox_image,
        workdir="/workspace",
        cpus=1.0,
        memory_mb=256,
        pids=64,
        expires_at=time.time() + 300,
    )
    handle = await backend.start(spec)
    try:
        token = uuid.uuid4().hex[:12]
        command = f"setsid -f sh -c 'while :; do : {token}; done' </dev/null >/dev/null 2>&1; sleep 600"
        request = ExecRequest(command=command, timeout_s=600)
        running = asyncio.create_task(backend.exec(handle, request, max_output_bytes=1 << 16))
        await asyncio.sleep(2.0)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        listing = "for d in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $d; echo; done"
        left = await backend.exec(handle, ExecRequest(command=listing), max_output_bytes=1 << 16)
        running_now = {line.strip() for line in left.stdout.splitlines()}
        # (the exec's own supervisor, ending, may still be listed: it holds the command's text)
        assert {"sleep 600", f"sh -c while :; do : {token}; done"} & running_now == set(), running_now
    finally:
        await backend.stop(handle)
        await backend.close()


async def test_a_container_that_dies_is_reported_as_stopped(
    client: SandboxClient, docker_client: Any, owner: str
) -> None:
    async with client.session() as info:
        container = _container(docker_client, owner, info.id)
        running = asyncio.create_task(client.exec(info.id, "sleep 60", timeout_s=120))
        await asyncio.sleep(1.5)
        await asyncio.to_thread(container.kill)
        with pytest.raises(SandboxStopped, match="died|not running"):
            await running
        with pytest.raises(SandboxStopped):
            await client.exec(info.id, "echo hello")


async def test_filling_tmp_fails_the_write_not_the_sandbox(client: SandboxClient) -> None:
    async with client.session(memory_mb=128) as info:
        fill = await client.exec(info.id, "dd if=/dev/zero of=/tmp/fill bs=1M count=200", timeout_s=60)
        assert fill.exit_code != 0 and "No space left" in fill.stderr and not fill.oom_killed
        assert (await client.exec(info.id, "rm /tmp/fill; echo alive")).stdout == "alive\n"


async def test_limits_over_the_operator_maxima_are_refused(client: SandboxClient) -> None:
    with pytest.raises(LimitExceeded, match="pids=65536"):
        await client.create_session(pids=65536)
    with pytest.raises(LimitExceeded, match="memory_mb"):
        await client.create_session(memory_mb=1 << 20)
