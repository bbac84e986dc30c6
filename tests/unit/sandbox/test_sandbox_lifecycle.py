"""Bounded container lifecycle calls and wedged-engine detection (sandbox/backends/lifecycle.py).

The fake engine here blocks its create call, as Docker 20.10 does when libnetwork deadlocks; the
gateway must then answer 503 naming the engine, the stuck call and the fix, never time out silently.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest

from stacx.sandbox.backends.lifecycle import LifecycleGuard
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import EngineWedged
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import WedgingBackend, serve_gateway


class _Probe:
    def __init__(self) -> None:
        self.answers = False

    def __call__(self) -> None:
        if not self.answers:
            raise ConnectionError("engine does not answer")


def _guard(probe: _Probe, *, concurrency: int = 2, stuck_after_s: float = 0.3) -> LifecycleGuard:
    return LifecycleGuard(
        engine="unix:///fake.sock",
        concurrency=concurrency,
        stuck_after_s=stuck_after_s,
        probe=probe,
        probe_every_s=0.05,
        hint=" Fix: restart the engine.",
    )


async def test_at_most_concurrency_calls_run_at_once() -> None:
    guard = _guard(_Probe(), concurrency=3, stuck_after_s=30)
    lock, running, peak = threading.Lock(), [0], [0]

    def call() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        threading.Event().wait(0.02)
        with lock:
            running[0] -= 1

    await asyncio.gather(*(guard.run("create", call) for _ in range(40)))
    guard.close()
    assert peak[0] == 3  # counted by the calls themselves, not by the guard


async def test_a_hung_call_marks_the_engine_wedged_and_later_calls_fail_fast() -> None:
    probe, release = _Probe(), threading.Event()
    guard = _guard(probe)
    with pytest.raises(EngineWedged, match=r"fake.sock.*`create from img` has been running .*restart"):
        await guard.run("create from img", release.wait)
    assert guard.problem is not None
    never_called = threading.Event()
    with pytest.raises(EngineWedged):
        await guard.run("remove c1", never_called.set)
    assert not never_called.is_set()  # refused before it reached the wedged engine

    probe.answers = True
    release.set()  # the engine is back: the stuck call returns
    await asyncio.sleep(0.1)
    assert await guard.run("create again", lambda: "ok") == "ok"
    assert guard.problem is None
    guard.close()


async def test_the_engine_stays_wedged_while_its_probe_fails() -> None:
    probe, release = _Probe(), threading.Event()
    guard = _guard(probe)
    with pytest.raises(EngineWedged):
        await guard.run("create", release.wait)
    release.set()  # the stuck call ended, but the engine still does not answer
    await asyncio.sleep(0.1)
    with pytest.raises(EngineWedged):
        await guard.run("create", lambda: "ok")
    guard.close()


@pytest.fixture
def wedging() -> Iterator[tuple[WedgingBackend, str]]:
    backend = WedgingBackend()
    with serve_gateway(backend, token=None, config=SessionManager.Config(owner="wedge")) as url:
        yield backend, url
    backend.release.set()
    backend.guard.close()


async def test_gateway_answers_503_naming_the_engine_and_the_fix(wedging: tuple[WedgingBackend, str]) -> None:
    _, url = wedging
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.get("/healthz")).json()["status"] == "ok"
        answer = await http.post("/v1/sessions", json={"image": "stacx/sandbox:bookworm"})
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["type"] == "EngineWedged"
        assert "create a container from stacx/sandbox:bookworm" in error["message"]
        assert "restart the engine" in error["message"]
        health = await http.get("/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert "not answering" in health.json()["problem"]


async def test_client_raises_engine_wedged_and_reads_a_degraded_health(
    wedging: tuple[WedgingBackend, str],
) -> None:
    _, url = wedging
    async with SandboxClient(SandboxClient.Config(base_url=url, max_retries=1)) as client:
        with pytest.raises(EngineWedged, match="not answering"):
            await client.create_session(image="stacx/sandbox:bookworm")
        health = await client.health()
    assert health.status == "degraded" and health.problem


@pytest.mark.parametrize("when", ["while running", "after it returned"])
async def test_a_call_the_caller_abandons_is_undone(when: str) -> None:
    guard = _guard(_Probe(), stuck_after_s=30)
    release, returned, undone = threading.Event(), threading.Event(), []

    def create() -> str:
        release.wait()
        returned.set()
        return "container-1"

    task = asyncio.create_task(guard.run("create", create, undo=undone.append))
    await asyncio.sleep(0.05)
    if when == "after it returned":
        release.set()
        returned.wait(5)
    task.cancel()  # e.g. SIGTERM: asyncio.run cancels every task on the way out
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    for _ in range(100):
        if undone:
            break
        await asyncio.sleep(0.02)
    guard.close()
    assert undone == ["container-1"]  # the container the caller never got is removed
