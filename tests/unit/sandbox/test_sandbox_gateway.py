"""The HTTP gateway and its client, over an in-memory backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from stacx.sandbox.backends.fake import FakeBackend, FakeSandbox
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import (
    AuthError,
    CapacityExceeded,
    InvalidSpec,
    PathRejected,
    SandboxFileNotFound,
    SessionExpired,
    SessionNotFound,
)
from stacx.sandbox.gateway import create_app
from stacx.sandbox.models import ExecRequest, ExecResult, SessionSpec
from stacx.sandbox.paths import tar_files
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import serve_gateway

TOKEN = "unit-token"


def _handler(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    env = ",".join(f"{k}={v}" for k, v in sorted(request.env.items()))
    return ExecResult(
        exit_code=3 if request.command == "fail" else 0,
        stdout=f"{request.command}|{request.stdin}|{env}|{request.workdir}",
        stderr="",
        duration_s=0.01,
    )


@pytest.fixture(scope="module")
def backend() -> FakeBackend:
    return FakeBackend(_handler)


@pytest.fixture(scope="module")
def url(backend: FakeBackend) -> Iterator[str]:
    with serve_gateway(
        backend, token=TOKEN, config=SessionManager.Config(owner="gw", max_sessions=20)
    ) as base:
        yield base


@pytest.fixture
async def client(url: str) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(SandboxClient.Config(base_url=url, token=TOKEN)) as c:
        yield c


async def test_health_needs_no_token(url: str) -> None:
    async with SandboxClient(SandboxClient.Config(base_url=url)) as anonymous:
        health = await anonymous.health()
    assert health.status == "ok" and health.backend == "fake"


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_missing_or_wrong_token_is_401(url: str, token: str | None) -> None:
    async with SandboxClient(SandboxClient.Config(base_url=url, token=token)) as c:
        with pytest.raises(AuthError):
            await c.create_session()
        with pytest.raises(AuthError):
            await c.metrics()
    response = httpx.post(f"{url}/v1/sessions", json={}, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


async def test_session_round_trip(client: SandboxClient, backend: FakeBackend) -> None:
    async with client.session(SessionSpec(env={"S": "1"})) as info:
        assert (await client.get_session(info.id)).id == info.id
        assert info.id in {s.id for s in await client.list_sessions()}
        result = await client.exec(info.id, "echo", stdin="in", env={"E": "2"}, workdir="sub")
        assert result.stdout == "echo|in|E=2|/workspace/sub"
        assert (await client.exec(info.id, "fail")).exit_code == 3
        written = await client.upload(info.id, "dir/f.txt", "hello")
        assert (written.path, written.size) == ("/workspace/dir/f.txt", 5)
        assert await client.download(info.id, "dir/f.txt") == b"hello"
        await client.upload_archive(info.id, "/tmp/x", tar_files({"a": b"1", "b/c": b"2"}))
        assert backend.sandboxes[f"fake-{info.id}"].files["/tmp/x/b/c"] == b"2"
        assert b"b/c" in await client.download_archive(info.id, "/tmp/x")
    with pytest.raises(SessionExpired):
        await client.exec(info.id, "echo")
    assert info.id in backend.stopped


async def test_errors_cross_the_wire_as_their_class(client: SandboxClient) -> None:
    with pytest.raises(SessionNotFound):
        await client.exec("sb-nope", "echo")
    await client.close_session("sb-nope")  # missing_ok
    with pytest.raises(SessionNotFound):
        await client.close_session("sb-nope", missing_ok=False)
    async with client.session() as info:
        with pytest.raises(SandboxFileNotFound):
            await client.download(info.id, "absent.txt")
        with pytest.raises(InvalidSpec, match="network"):
            await client.create_session(network="bridge")
        with pytest.raises(InvalidSpec, match="timeout_s"):
            await client.exec(info.id, "echo", timeout_s=-1)
    raw = httpx.post(
        f"{client.config.base_url}/v1/sessions",
        json={"network": "bridge"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert raw.status_code == 422 and "network" in raw.text


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../../x"])
async def test_path_traversal_is_rejected(client: SandboxClient, path: str) -> None:
    async with client.session() as info:
        with pytest.raises(PathRejected):
            await client.upload(info.id, path, b"x")
        with pytest.raises(PathRejected):
            await client.download(info.id, path)
        with pytest.raises(PathRejected):
            await client.exec(info.id, "ls", workdir=path)


async def test_archive_with_link_is_rejected(client: SandboxClient) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    async with client.session() as info:
        with pytest.raises(PathRejected, match="link"):
            await client.upload_archive(info.id, "dir", buffer.getvalue())


async def test_capacity_is_503_and_retriable(url: str) -> None:
    # max_retries=0: the client would otherwise retry the 503 itself before raising it.
    async with SandboxClient(SandboxClient.Config(base_url=url, token=TOKEN, max_retries=0)) as c:
        opened = []
        try:
            with pytest.raises(CapacityExceeded) as info:
                for _ in range(21):
                    opened.append((await c.create_session()).id)
            assert info.value.retriable and len(opened) == 20
        finally:
            for sid in opened:
                await c.close_session(sid)


async def test_metrics_count_operations(client: SandboxClient) -> None:
    async with client.session() as info:
        await client.exec(info.id, "echo")
        text = await client.metrics()
    assert "stacx_sandbox_sessions_active" in text
    count = next(line for line in text.splitlines() if line.startswith("stacx_sandbox_execs_total"))
    assert int(float(count.split()[1])) >= 1


async def test_asgi_transport_works_in_process() -> None:
    manager = SessionManager(SessionManager.Config(owner="asgi"), FakeBackend(_handler))
    transport = httpx.ASGITransport(app=create_app(manager, token=TOKEN))
    config = SandboxClient.Config(base_url="http://gateway", token=TOKEN, transport=transport)
    async with manager, SandboxClient(config) as c:
        info = await c.create_session()
        assert (await c.exec(info.id, "hi")).stdout.startswith("hi|")


def test_base_url_is_validated() -> None:
    with pytest.raises(InvalidSpec, match="base_url"):
        SandboxClient(SandboxClient.Config(base_url="127.0.0.1:8700"))


async def test_gateway_generates_a_token_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from stacx.sandbox.gateway import TOKEN_ENV, Gateway

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    gateway = Gateway(Gateway.Config(), backend=FakeBackend(_handler))
    assert len(gateway.token) >= 24 and gateway.manager.images is None
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as raw:
        assert (await raw.get("/v1/sessions")).status_code == 401
        headers = {"Authorization": f"Bearer {gateway.token}"}
        assert (await raw.get("/v1/sessions", headers=headers)).json() == []
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert Gateway(Gateway.Config(), backend=FakeBackend()).token == "from-env"


async def test_gateway_spans_continue_the_callers_trace_across_the_http_hop(client: SandboxClient) -> None:
    from opentelemetry import trace
    from tracing_fixtures import in_memory_tracing

    with in_memory_tracing() as exported:
        with trace.get_tracer("test").start_as_current_span("episode") as episode:
            info = await client.create_session(SessionSpec())
            await client.exec(info.id, "echo hi")
            await client.close_session(info.id)
        for _ in range(100):  # the server thread ends its span just after sending the response
            spans = exported.get_finished_spans()
            if "gateway.close" in {s.name for s in spans}:
                break
            await asyncio.sleep(0.05)
    by_name = {s.name: s for s in spans}
    assert {"gateway.create", "gateway.exec", "gateway.close"} <= set(by_name), sorted(by_name)
    exec_span = by_name["gateway.exec"]
    assert exec_span.kind is trace.SpanKind.SERVER
    assert exec_span.context.trace_id == episode.get_span_context().trace_id
    assert exec_span.parent is not None and exec_span.parent.span_id == episode.get_span_context().span_id
    assert exec_span.attributes["http.response.status_code"] == 200
