"""Operator-owned limits: per-session maxima (400), the total budget (503), the host check."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from stacx.sandbox.backends.fake import FakeBackend
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import CapacityExceeded, GatewayConfigError, LimitExceeded
from stacx.sandbox.gateway import create_app
from stacx.sandbox.limits import PID_RESERVE, SessionLimits
from stacx.sandbox.models import SessionSpec
from stacx.sandbox.protocols import HostCapacity
from stacx.sandbox.sessions import SessionManager

SMALL_HOST = HostCapacity(cpus=2.0, memory_mb=4096, pid_max=32768)
TOKEN = "limits-token"


def _manager(host: HostCapacity = SMALL_HOST, **fields: Any) -> SessionManager:
    limits = fields.pop("limits", SessionLimits.Config())
    config = SessionManager.Config(owner="limits", limits=limits, **fields)
    return SessionManager(config, FakeBackend(capacity=host))


def test_defaults_fit_a_small_host_and_derive_the_budget_from_it() -> None:
    manager = _manager(default_memory_mb=512)
    assert manager.limits.budget_pids == 32768 * 3 // 4
    assert manager.limits.budget_memory_mb == 4096 and manager.limits.max_cpus == 2.0


@pytest.mark.parametrize(
    ("limits", "fields", "message"),
    [
        (SessionLimits.Config(budget_pids=32768), {}, "budget_pids=32768 leaves the host fewer than"),
        (SessionLimits.Config(budget_memory_mb=8192), {}, "exceeds the host's memory"),
        (SessionLimits.Config(max_cpus=8), {}, "max_cpus=8 exceeds the host's 2 cores"),
        (SessionLimits.Config(budget_cpus=4), {}, "budget_cpus=4 exceeds the host's 2 cores"),
        (SessionLimits.Config(max_pids=8192, budget_pids=4096), {}, "max_pids=8192 is above budget_pids"),
        (SessionLimits.Config(max_pids=128), {"default_pids": 256}, "default_pids=256 is above"),
        (SessionLimits.Config(max_idle_timeout_s=60), {}, "idle_timeout_s=1800 is above"),
    ],
)
def test_limits_that_do_not_fit_the_host_fail_at_construction(
    limits: SessionLimits.Config, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(GatewayConfigError, match=message):
        _manager(limits=limits, default_memory_mb=512, **fields)


def test_memory_overcommit_must_be_explicit() -> None:
    limits = SessionLimits.Config(budget_memory_mb=8192, memory_overcommit=2.0)
    assert _manager(limits=limits, default_memory_mb=512).limits.budget_memory_mb == 8192


def test_unknown_pid_max_assumes_the_kernel_default() -> None:
    host = HostCapacity(cpus=2.0, memory_mb=4096, pid_max=None)
    with pytest.raises(GatewayConfigError, match=f"at most {32768 - PID_RESERVE}"):
        _manager(host, limits=SessionLimits.Config(budget_pids=32000), default_memory_mb=512)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (SessionSpec(pids=65536), "pids=65536"),
        (SessionSpec(memory_mb=1 << 20), "memory_mb=1048576"),
        (SessionSpec(cpus=4), "cpus=4"),
        (SessionSpec(idle_timeout_s=1e9), "idle_timeout_s=1000000000"),
    ],
)
async def test_a_client_asks_within_the_maxima_or_is_refused(spec: SessionSpec, field: str) -> None:
    async with _manager(default_memory_mb=512) as manager:
        with pytest.raises(LimitExceeded, match=f"asks {field}, above this gateway's maximum"):
            await manager.create(spec)
        assert manager.list() == [] and manager.limits.in_use.pids == 0


async def test_the_budget_bounds_the_sum_of_live_sessions_and_is_returned_on_close() -> None:
    limits = SessionLimits.Config(budget_pids=1000, max_pids=600)
    async with _manager(limits=limits, default_memory_mb=512) as manager:
        first = await manager.create(SessionSpec(pids=600))
        with pytest.raises(CapacityExceeded, match=r"pids=1200, above the gateway's budget of 1000"):
            await manager.create(SessionSpec(pids=600))
        second = await manager.create(SessionSpec(pids=400))
        assert manager.limits.in_use.pids == 1000
        await manager.close(first.id)
        await manager.create(SessionSpec(pids=600))
        await manager.close(second.id)
        assert manager.limits.in_use.pids == 600


async def test_warm_pool_sandboxes_hold_the_budget_and_hand_it_to_their_session() -> None:
    limits = SessionLimits.Config(budget_pids=1000, max_pids=1000)
    async with _manager(limits=limits, default_memory_mb=512, warm_pool_size=2) as manager:
        while manager.warm < 2:
            await _settle()
        assert manager.limits.in_use.pids == 2 * 256
        info = await manager.create()  # taken from the pool: nothing new is reserved
        assert manager.limits.in_use.pids == 2 * 256
        while manager.warm < 2:  # the pool refills, reserving for the new sandbox
            await _settle()
        assert manager.limits.in_use.pids == 3 * 256
        await manager.close(info.id)
        assert manager.limits.in_use.pids == 2 * 256
    assert manager.limits.in_use.pids == 0  # stop() returns everything


async def _settle() -> None:
    import asyncio

    await asyncio.sleep(0)


async def test_over_the_maxima_is_http_400_with_the_field_named() -> None:
    manager = _manager(default_memory_mb=512)
    transport = httpx.ASGITransport(app=create_app(manager, token=TOKEN))
    async with manager, httpx.AsyncClient(transport=transport, base_url="http://gw") as raw:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        answer = await raw.post("/v1/sessions", json={"pids": 4096}, headers=headers)
        assert answer.status_code == 400
        assert answer.json()["error"]["type"] == "LimitExceeded"
        assert "pids=4096" in answer.json()["error"]["message"]
        config = SandboxClient.Config(base_url="http://gw", token=TOKEN, transport=transport)
        async with SandboxClient(config) as client:
            with pytest.raises(LimitExceeded, match="limits.max_memory_mb"):
                await client.create_session(SessionSpec(memory_mb=65536))
