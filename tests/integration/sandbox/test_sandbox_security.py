"""Isolation under attack (docker backend): fork bombs, memory hogs, endless loops, privileges,
plus the gateway's own guards (auth, traversal) on a real backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.backends.docker import LABEL_OWNER
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import AuthError, PathRejected
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import serve_gateway

TOKEN = "security-token"


@pytest.fixture(scope="module")
def owner() -> str:
    return f"test-security-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def url(sandbox_image: str, owner: str, docker_client) -> Iterator[str]:  # type: ignore[no-untyped-def]
    config = SessionManager.Config(owner=owner, default_image=sandbox_image)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config) as base:
        yield base
    left = docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    assert left == [], f"leaked containers: {left}"


@pytest.fixture
async def client(url: str) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(SandboxClient.Config(base_url=url, token=TOKEN)) as c:
        yield c


async def test_fork_bomb_is_contained(client: SandboxClient) -> None:
    async with client.session(pids=64) as bomb, client.session() as neighbour:
        result = await client.exec(bomb.id, "f() { f | f & }; f; sleep 30", timeout_s=5)
        assert result.timed_out or result.exit_code != 0
        after = await client.exec(bomb.id, "echo alive", timeout_s=30)
        assert after.stdout == "alive\n"
        other = await client.exec(neighbour.id, "echo fine", timeout_s=30)
        assert other.stdout == "fine\n"


async def test_memory_hog_is_killed_and_reported(client: SandboxClient) -> None:
    async with client.session(memory_mb=128) as info:
        hog = "python3 -c 'b = bytearray(1024 * 1024 * 1024); print(len(b))'"
        result = await client.exec(info.id, hog, timeout_s=60)
        assert result.oom_killed and result.exit_code == 137 and not result.timed_out
        assert (await client.exec(info.id, "echo ok")).stdout == "ok\n"
        small = await client.exec(info.id, "python3 -c 'b = bytearray(16 * 1024 * 1024)'")
        assert small.ok and not small.oom_killed


async def test_infinite_loop_dies_at_its_timeout(client: SandboxClient) -> None:
    async with client.session() as info:
        result = await client.exec(info.id, "while :; do :; done", timeout_s=1.5)
        assert result.timed_out and result.exit_code == 137
        # the pattern `do [:]; done` matches the loop's command line but not this probe's own
        probe = (
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
            " | grep -c 'do [:]; done' || true"
        )
        leftovers = await client.exec(info.id, probe)
        assert leftovers.stdout.strip() == "0"


async def test_no_privileges_inside(client: SandboxClient) -> None:
    async with client.session() as info:
        status = await client.exec(info.id, "grep -E '^(CapEff|CapBnd|NoNewPrivs|Uid)' /proc/self/status")
        fields = dict(line.split(":", 1) for line in status.stdout.splitlines())
        assert fields["CapEff"].strip() == "0000000000000000"
        assert fields["CapBnd"].strip() == "0000000000000000"
        assert fields["NoNewPrivs"].strip() == "1"
        assert fields["Uid"].split()[0] == "1000"
        assert (await client.exec(info.id, "mount -t tmpfs none /mnt")).exit_code != 0
        assert (await client.exec(info.id, "echo x > /proc/sys/kernel/hostname")).exit_code != 0


async def test_container_is_hardened(client: SandboxClient, docker_client, owner: str) -> None:  # type: ignore[no-untyped-def]
    async with client.session(cpus=0.5, memory_mb=256, pids=100) as info:
        (container,) = docker_client.containers.list(
            filters={"label": [f"{LABEL_OWNER}={owner}", f"stacx.sandbox.session={info.id}"]}
        )
        host = container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges:true" in host["SecurityOpt"]
        assert (host["PidsLimit"], host["Memory"], host["NanoCpus"]) == (100, 256 << 20, 5 * 10**8)
        assert host["MemorySwap"] == 256 << 20
        assert container.attrs["Config"]["User"] == "1000:1000"


async def test_auth_and_traversal_on_real_backend(url: str, client: SandboxClient) -> None:
    for token in (None, "wrong"):
        async with SandboxClient(SandboxClient.Config(base_url=url, token=token)) as stranger:
            with pytest.raises(AuthError):
                await stranger.create_session()
    assert httpx.get(f"{url}/v1/sessions").status_code == 401
    async with client.session() as info:
        for path in ("../../../etc/shadow", "/etc/shadow", "/proc/self/environ", "x/../../.."):
            with pytest.raises(PathRejected):
                await client.download(info.id, path)
            with pytest.raises(PathRejected):
                await client.upload(info.id, path, b"owned")
