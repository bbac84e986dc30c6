"""SandboxClient retries retry-safe calls on connection errors and 502/503, never `exec`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from stacx.sandbox.client import SandboxClient, _backoff_delay
from stacx.sandbox.errors import BackendError, CapacityExceeded, InvalidSpec, SessionNotFound

SESSION = {
    "id": "s1",
    "image": "stacx/sandbox:bookworm",
    "backend": "fake",
    "workdir": "/work",
    "cpus": 1.0,
    "memory_mb": 512,
    "pids": 64,
    "network": "none",
    "created_at": 0.0,
    "expires_at": 60.0,
    "idle_timeout_s": 30.0,
    "last_used_at": 0.0,
}
EXEC = {"exit_code": 0, "stdout": "", "stderr": "", "duration_s": 0.1}

Step = Callable[[httpx.Request], httpx.Response]


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _reset(request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request)


def _read_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def _answer(status: int, body: object, error_type: str | None = None) -> Step:
    payload = {"error": {"type": error_type, "message": "m"}} if error_type else body
    return lambda request: httpx.Response(status, json=payload)


class Script:
    """A MockTransport handler answering each request with the next step (the last one repeats)."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.steps[min(len(self.requests), len(self.steps)) - 1]
        return step(request)


def _client(script: Script, *, max_retries: int = 3) -> SandboxClient:
    transport = httpx.MockTransport(script)
    config = SandboxClient.Config(
        base_url="http://gateway",
        transport=transport,
        max_retries=max_retries,
        retry_backoff_s=0.0,
        retry_backoff_max_s=0.0,
    )
    return SandboxClient(config)


@pytest.fixture
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr("stacx.sandbox.client.random.uniform", lambda low, high: high)
    yield


async def test_create_session_is_retried_after_refused_and_reset_connections() -> None:
    script = Script(_refused, _reset, _answer(200, SESSION))
    async with _client(script) as client:
        info = await client.create_session(image="stacx/sandbox:bookworm")
    assert info.id == "s1"
    assert [r.method for r in script.requests] == ["POST"] * 3


@pytest.mark.parametrize("status,error_type", [(502, "BackendError"), (503, "CapacityExceeded"), (503, None)])
async def test_idempotent_calls_are_retried_after_502_and_503(status: int, error_type: str | None) -> None:
    script = Script(_answer(status, {"detail": "proxy"}, error_type), _answer(200, SESSION))
    async with _client(script) as client:
        assert (await client.get_session("s1")).id == "s1"
    assert len(script.requests) == 2


async def test_downloads_are_retried() -> None:
    script = Script(_refused, lambda request: httpx.Response(200, content=b"data"))
    async with _client(script) as client:
        assert await client.download("s1", "f.txt") == b"data"
    assert len(script.requests) == 2


async def test_retries_are_bounded_and_the_error_says_how_many_attempts() -> None:
    script = Script(_refused)
    async with _client(script, max_retries=2) as client:
        with pytest.raises(BackendError, match="after 3 attempts"):
            await client.health()
    assert len(script.requests) == 3


async def test_last_gateway_error_is_raised_when_retries_run_out() -> None:
    script = Script(_answer(503, None, "CapacityExceeded"))
    async with _client(script, max_retries=1) as client:
        with pytest.raises(CapacityExceeded):
            await client.create_session()
    assert len(script.requests) == 2


async def test_max_retries_zero_disables_retry() -> None:
    script = Script(_refused, _answer(200, SESSION))
    async with _client(script, max_retries=0) as client:
        with pytest.raises(BackendError, match="cannot reach"):
            await client.create_session()
    assert len(script.requests) == 1


@pytest.mark.parametrize("failure", [_refused, _answer(502, None, "BackendError")])
async def test_exec_is_never_retried(failure: Step) -> None:
    script = Script(failure, _answer(200, EXEC))
    async with _client(script) as client:
        with pytest.raises(BackendError):
            await client.exec("s1", "rm -rf build && make")
    assert len(script.requests) == 1


async def test_verify_remote_is_never_retried() -> None:
    script = Script(_reset, _answer(200, {"reward": 1.0, "rewards": {}}))
    async with _client(script) as client:
        with pytest.raises(BackendError):
            await client.verify_remote("s1")
    assert len(script.requests) == 1


@pytest.mark.parametrize("failure", [_read_timeout, _answer(404, None, "SessionNotFound")])
async def test_timeouts_and_client_errors_are_not_retried(failure: Step) -> None:
    script = Script(failure, _answer(200, SESSION))
    async with _client(script) as client:
        with pytest.raises((BackendError, SessionNotFound)):
            await client.get_session("s1")
    assert len(script.requests) == 1


def test_backoff_doubles_up_to_the_cap(no_jitter: None) -> None:
    config = SandboxClient.Config(base_url="http://gateway", retry_backoff_s=0.5, retry_backoff_max_s=3.0)
    assert [_backoff_delay(config, attempt) for attempt in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_backoff_jitter_stays_in_the_upper_half() -> None:
    config = SandboxClient.Config(base_url="http://gateway", retry_backoff_s=1.0, retry_backoff_max_s=1.0)
    delays = [_backoff_delay(config, 0) for _ in range(200)]
    assert all(0.5 <= d <= 1.0 for d in delays)


@pytest.mark.parametrize(
    "max_retries,backoff_s,backoff_max_s,field",
    [(-1, 0.2, 5.0, "max_retries"), (3, -0.1, 5.0, "retry_backoff_s"), (3, 2.0, 1.0, "retry_backoff_max_s")],
)
def test_retry_config_is_validated(
    max_retries: int, backoff_s: float, backoff_max_s: float, field: str
) -> None:
    config = SandboxClient.Config(
        base_url="http://gateway",
        max_retries=max_retries,
        retry_backoff_s=backoff_s,
        retry_backoff_max_s=backoff_max_s,
    )
    with pytest.raises(InvalidSpec, match=field):
        SandboxClient(config)
