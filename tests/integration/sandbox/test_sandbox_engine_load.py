"""The real Docker engine under the load that once wedged it: never a deadlock.

Docker 20.10 deadlocked in libnetwork when the gateway let ~100 container starts run at once. Here
5 rounds of 64 concurrent create/exec/remove cycles plus a warm pool of 8 go through the gateway;
each round has a generous bound, and a wedge fails with where the engine's goroutine dump is.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from stacx.infra.services import docker_engine
from stacx.infra.services.processes import read_pid
from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.backends.docker import LABEL_OWNER
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import serve_gateway

ROUNDS, SESSIONS, WARM_POOL = 5, 64, 8
ROUND_BOUND_S = 240.0
"""A round takes ~10 s on 2 cores; only a wedged engine comes near this."""


def _wedged_message(round_: int, backend: DockerBackend) -> str:
    pid = read_pid(docker_engine.pid_file())
    if pid is not None:  # dockerd writes its goroutine stacks on SIGUSR1 and logs where
        os.kill(pid, signal.SIGUSR1)
        log = docker_engine.log_file()
        where = f"goroutine dump of dockerd pid {pid}: see 'goroutine stacks written to' in {log}"
    else:
        where = "dockerd was not started by stacx: `kill -USR1 <dockerd pid>` writes its goroutine dump"
    return (
        f"round {round_ + 1}/{ROUNDS} of {SESSIONS} concurrent sessions did not finish within "
        f"{ROUND_BOUND_S:.0f}s (engine problem: {backend.problem}); {where}"
    )


async def _round(client: SandboxClient, image: str) -> list[str]:
    async def cycle(i: int) -> str:
        session = await client.create_session(image=image, memory_mb=128, cpus=0.5)
        try:
            result = await client.exec(session.id, f"echo cycle-{i}", timeout_s=60)
        finally:
            await client.close_session(session.id)
        return result.stdout.strip()

    return list(await asyncio.gather(*(cycle(i) for i in range(SESSIONS))))


async def test_rounds_of_concurrent_sessions_never_wedge_the_engine(
    sandbox_image: str, docker_client
) -> None:  # type: ignore[no-untyped-def]
    owner = f"test-load-{uuid.uuid4().hex[:8]}"
    backend = DockerBackend()
    assert backend.lifecycle.concurrency <= 8  # the bound that keeps libnetwork out of its deadlock
    config = SessionManager.Config(
        owner=owner, default_image=sandbox_image, max_sessions=SESSIONS + WARM_POOL, warm_pool_size=WARM_POOL
    )
    try:
        with serve_gateway(backend, token=None, config=config) as url:
            async with SandboxClient(SandboxClient.Config(base_url=url, timeout_s=ROUND_BOUND_S)) as client:
                for round_ in range(ROUNDS):
                    try:
                        outputs = await asyncio.wait_for(_round(client, sandbox_image), ROUND_BOUND_S)
                    except TimeoutError:
                        pytest.fail(_wedged_message(round_, backend), pytrace=False)
                    assert outputs == [f"cycle-{i}" for i in range(SESSIONS)]
                    assert backend.problem is None
                    assert backend.lifecycle.in_flight() <= backend.lifecycle.concurrency
                metrics = (await client.metrics()).splitlines()
        left = docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
        assert left == [], f"{len(left)} containers of {owner} left after the gateway stopped"
        assert any(line.startswith("stacx_sandbox_") for line in metrics)
    finally:
        await backend.close()
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"}):
            container.remove(force=True, v=True)
