"""One contract, two real backends (docker, process): the gateway behaves the same over both."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from stacx.sandbox.backends import DockerBackend, ProcessBackend
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import PathRejected, SandboxFileNotFound, SessionNotFound
from stacx.sandbox.models import SessionInfo
from stacx.sandbox.paths import tar_files
from stacx.sandbox.protocols import SandboxBackend
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import serve_gateway

TOKEN = "contract-token"


def _backend(name: str) -> SandboxBackend:
    return DockerBackend() if name == "docker" else ProcessBackend()


@pytest.fixture(scope="module", params=["docker", "process"])
def gateway(request: pytest.FixtureRequest, sandbox_image: str) -> Iterator[tuple[str, str]]:
    owner = f"test-contract-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image)
    with serve_gateway(_backend(request.param), token=TOKEN, config=config) as url:
        yield url, request.param
    if request.param == "docker":
        import docker

        left = docker.from_env().containers.list(all=True, filters={"label": f"stacx.sandbox.owner={owner}"})
        assert left == [], f"leaked containers: {left}"


@pytest.fixture
async def client(gateway: tuple[str, str]) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(SandboxClient.Config(base_url=gateway[0], token=TOKEN)) as c:
        yield c


@pytest.fixture
async def session(client: SandboxClient) -> AsyncIterator[SessionInfo]:
    async with client.session(env={"FROM_SESSION": "yes"}) as info:
        yield info


async def test_exec_reports_streams_and_exit_code(client: SandboxClient, session: SessionInfo) -> None:
    result = await client.exec(session.id, "echo out; echo err >&2; exit 7", timeout_s=20)
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert not result.timed_out and result.duration_s > 0


async def test_stdin_env_workdir_and_user(client: SandboxClient, session: SessionInfo) -> None:
    await client.exec(session.id, "mkdir -p sub")
    command = 'cat; echo "$FROM_SESSION $FROM_EXEC"; pwd; id -u'
    result = await client.exec(session.id, command, stdin="line\n", env={"FROM_EXEC": "1"}, workdir="sub")
    assert result.stdout == f"line\nyes 1\n{session.workdir}/sub\n1000\n"


async def test_timeout_kills_the_whole_process_group(client: SandboxClient, session: SessionInfo) -> None:
    command = "(sleep 2; echo late > /tmp/late.txt) & while :; do :; done"
    result = await client.exec(session.id, command, timeout_s=1)
    assert result.timed_out and result.exit_code == 137
    await asyncio.sleep(2.5)
    with pytest.raises(SandboxFileNotFound):
        await client.download(session.id, "/tmp/late.txt")


def _host_processes(token: str) -> dict[int, float]:
    """CPU seconds so far of each process on this host whose command line holds `token`."""
    ticks = 100.0  # USER_HZ
    found: dict[int, float] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if token.encode() not in (proc / "cmdline").read_bytes():
                continue
            fields = (proc / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if fields[0] != "Z":
            found[int(proc.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def _seconds_until_gone(token: str, limit_s: float = 20.0) -> float:
    """Seconds until no process holding `token` runs on this host (fails past `limit_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if not _host_processes(token):
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"processes {sorted(_host_processes(token))} still run {limit_s} s later")


async def test_an_escape_from_a_killed_exec_ends_with_it(client: SandboxClient, session: SessionInfo) -> None:
    token = f"escape-{uuid.uuid4().hex[:12]}"
    command = f"setsid -f sh -c 'while :; do : {token}; done'; sleep 600"
    result = await client.exec(session.id, command, timeout_s=2)
    assert result.timed_out and result.exit_code == 137
    assert await asyncio.to_thread(_seconds_until_gone, token) <= 5.0


async def test_long_output_is_truncated_and_flagged(client: SandboxClient, session: SessionInfo) -> None:
    result = await client.exec(session.id, "head -c 300000 /dev/zero | tr '\\0' a", max_output_bytes=1000)
    assert result.stdout == "a" * 1000 and result.stdout_truncated and not result.stderr_truncated


async def test_files_round_trip(client: SandboxClient, session: SessionInfo) -> None:
    payload = bytes(range(256)) * 10
    written = await client.upload(session.id, "data/blob.bin", payload)
    assert written.path == f"{session.workdir}/data/blob.bin"
    assert await client.download(session.id, "data/blob.bin") == payload
    size = await client.exec(session.id, "stat -c %s data/blob.bin")
    assert size.stdout.strip() == "2560"
    await client.upload_archive(session.id, "/tmp/tree", tar_files({"a.txt": b"A", "d/b.txt": b"B"}))
    listing = await client.exec(session.id, "cd /tmp/tree && find . -type f | sort && cat d/b.txt")
    assert listing.stdout == "./a.txt\n./d/b.txt\nB"
    with pytest.raises(SandboxFileNotFound):
        await client.download(session.id, "missing.txt")


async def test_traversal_is_rejected(client: SandboxClient, session: SessionInfo) -> None:
    with pytest.raises(PathRejected):
        await client.upload(session.id, "../../etc/cron.d/x", b"x")
    with pytest.raises(PathRejected):
        await client.download(session.id, "/etc/passwd")


async def test_no_writes_outside_writable_roots(client: SandboxClient, session: SessionInfo) -> None:
    for path in ("/usr/x", "/etc/x", "/x", "/bin/x"):
        result = await client.exec(session.id, f"touch {path}")
        assert result.exit_code != 0, path
    ok = await client.exec(session.id, "touch inside /tmp/t /logs/l /tests/t && echo ok")
    assert ok.stdout == "ok\n"


async def test_no_network(client: SandboxClient, session: SessionInfo) -> None:
    interfaces = await client.exec(session.id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert interfaces.stdout.split() == ["lo"]
    probe = (
        'python3 -c "import socket; s=socket.socket(); s.settimeout(3); '
        "s.connect(('1.1.1.1', 80)); print('CONNECTED')\""
    )
    result = await client.exec(session.id, probe, timeout_s=20)
    assert result.exit_code != 0 and "CONNECTED" not in result.stdout
    assert "unreachable" in result.stderr.lower() or "Errno" in result.stderr


async def test_sessions_cannot_see_each_other(client: SandboxClient) -> None:
    async with client.session() as first, client.session() as second:
        await client.exec(first.id, "echo s3cret > secret.txt && echo s3cret > /tmp/secret.txt")
        assert (await client.download(first.id, "secret.txt")) == b"s3cret\n"
        places = "/tmp /workspace /tests /logs /var /home /root /run /mnt /srv /opt"
        probe = f"cat secret.txt /tmp/secret.txt; grep -rls s3cret {places} 2>/dev/null; echo done"
        result = await client.exec(second.id, probe, timeout_s=60)
        assert not result.timed_out and result.stdout.endswith("done\n")
        assert "s3cret" not in result.stdout and "secret.txt" not in result.stdout


async def test_closed_session_is_gone(client: SandboxClient) -> None:
    info = await client.create_session()
    await client.close_session(info.id)
    with pytest.raises(SessionNotFound):
        await client.exec(info.id, "true")


async def test_concurrent_quick_execs_keep_their_output(client: SandboxClient, session: SessionInfo) -> None:
    results = await asyncio.gather(*(client.exec(session.id, f"echo {n}") for n in range(40)))
    assert [r.stdout for r in results] == [f"{n}\n" for n in range(40)]
    assert all(r.exit_code == 0 for r in results)
