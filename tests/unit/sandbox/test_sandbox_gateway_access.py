"""Who reaches what: per-client sessions, the admin token, size-limited bodies, no API docs."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from stacx.sandbox.backends.fake import FakeBackend
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import RequestTooLarge, SessionNotFound
from stacx.sandbox.gateway import create_app
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import serve_app

ADMIN, ALICE, BOB = "admin-token", "alice-token", "bob-token"
MAX_FILE = 1 << 20
MAX_REQUEST = 64 << 10


def _app(backend: FakeBackend) -> tuple[SessionManager, object]:
    config = SessionManager.Config(owner="access", max_file_bytes=MAX_FILE)
    manager = SessionManager(config, backend)
    app = create_app(manager, token=ADMIN, client_tokens=[ALICE, BOB], max_request_bytes=MAX_REQUEST)
    return manager, app


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[FakeBackend, httpx.ASGITransport]]:
    backend = FakeBackend()
    manager, app = _app(backend)
    async with manager:
        yield backend, httpx.ASGITransport(app=app)  # type: ignore[arg-type]


def _client(transport: httpx.ASGITransport, token: str) -> SandboxClient:
    return SandboxClient(SandboxClient.Config(base_url="http://gw", token=token, transport=transport))


async def test_a_session_is_reachable_only_with_its_token_or_the_admin_token(
    gateway: tuple[FakeBackend, httpx.ASGITransport],
) -> None:
    _backend, transport = gateway
    async with (
        _client(transport, ALICE) as alice,
        _client(transport, BOB) as bob,
        _client(transport, ADMIN) as admin,
    ):
        mine = await alice.create_session()
        theirs = await bob.create_session()
        assert (await alice.exec(mine.id, "echo")).ok
        for attempt in (
            bob.get_session(mine.id),
            bob.exec(mine.id, "echo"),
            bob.download(mine.id, "/etc/passwd"),
            bob.close_session(mine.id, missing_ok=False),
        ):
            with pytest.raises(SessionNotFound, match="for this token"):
                await attempt
        assert (await alice.get_session(mine.id)).id == mine.id  # Bob's close did nothing
        assert [s.id for s in await alice.list_sessions()] == [mine.id]
        assert {s.id for s in await admin.list_sessions()} == {mine.id, theirs.id}
        assert (await admin.exec(mine.id, "echo")).ok  # the operator reaches every session
        await alice.close_session(mine.id)
        await admin.close_session(theirs.id)


async def test_api_docs_are_not_served(gateway: tuple[FakeBackend, httpx.ASGITransport]) -> None:
    _backend, transport = gateway
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as raw:
        for path in ("/docs", "/redoc", "/openapi.json"):
            for headers in ({}, {"Authorization": f"Bearer {ADMIN}"}):
                assert (await raw.get(path, headers=headers)).status_code == 404


async def test_a_chunked_upload_past_the_limit_is_413_and_never_held_in_memory(
    gateway: tuple[FakeBackend, httpx.ASGITransport],
) -> None:
    backend, transport = gateway
    chunk = b"x" * (256 << 10)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: Transfer-Encoding chunked
        for _ in range(300):  # 75 MiB
            yield chunk

    headers = {"Authorization": f"Bearer {ALICE}"}
    async with (
        _client(transport, ALICE) as alice,
        httpx.AsyncClient(transport=transport, base_url="http://gw") as raw,
    ):
        info = await alice.create_session()
        tracemalloc.start()
        answer = await raw.put(
            f"/v1/sessions/{info.id}/files", params={"path": "big.bin"}, content=chunks(), headers=headers
        )
        _now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert answer.status_code == 413 and answer.json()["error"]["type"] == "RequestTooLarge"
    assert peak < 8 * MAX_FILE  # the body is counted and dropped, never gathered (75 MiB sent)
    assert "/workspace/big.bin" not in backend.sandboxes[f"fake-{info.id}"].files


async def test_a_json_body_over_the_request_limit_is_413(
    gateway: tuple[FakeBackend, httpx.ASGITransport],
) -> None:
    backend, transport = gateway
    async with _client(transport, ALICE) as alice:
        info = await alice.create_session()
        with pytest.raises(RequestTooLarge):
            await alice.exec(info.id, "cat", stdin="y" * (MAX_REQUEST + 1))
        assert backend.sandboxes[f"fake-{info.id}"].commands == []
        assert (await alice.exec(info.id, "cat", stdin="y" * 1000)).ok  # under it: fine


@pytest.fixture
def served() -> Iterator[str]:
    backend = FakeBackend()
    _manager, app = _app(backend)
    with serve_app(app) as url:
        yield url


def test_oversized_bodies_get_a_clean_413_over_real_http(served: str) -> None:
    headers = {"Authorization": f"Bearer {ALICE}"}
    with httpx.Client(base_url=served, headers=headers, timeout=30) as raw:
        info = raw.post("/v1/sessions", json={}).json()
        for _ in range(5):  # the client, still sending, reads the answer: no connection reset
            declared = raw.put(
                f"/v1/sessions/{info['id']}/files", params={"path": "f"}, content=b"z" * (4 * MAX_FILE)
            )
            chunked = raw.put(
                f"/v1/sessions/{info['id']}/files", params={"path": "f"}, content=iter([b"z" * MAX_FILE] * 4)
            )
            assert (declared.status_code, chunked.status_code) == (413, 413)
        answer = raw.put(f"/v1/sessions/{info['id']}/files", params={"path": "f"}, content=b"z" * 1000)
        assert answer.status_code == 200 and answer.json()["size"] == 1000
