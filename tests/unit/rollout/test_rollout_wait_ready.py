"""`inference.wait_ready_s`: a rollout service started together with its server and gateway waits
until both answer (the real clients, against scripted HTTP answers)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from stacx.rollout.errors import ServicesNotReadyError
from stacx.rollout.gateways import GatewayEnvironments
from stacx.rollout.inference import InferenceClient
from stacx.rollout.service import wait_until_up
from stacx.sandbox.client import SandboxClient


def _scripted(answers: list[int | None], seen: list[str]) -> httpx.MockTransport:
    """Answers in order (None: connection refused); the last one repeats."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status = answers.pop(0) if len(answers) > 1 else answers[0]
        if status is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(status, json={"status": "ok" if status == 200 else "degraded"})

    return httpx.MockTransport(handle)


def test_waits_through_refusals_and_a_starting_server_until_both_answer() -> None:
    server_seen: list[str] = []
    gateway_seen: list[str] = []
    server = InferenceClient(
        InferenceClient.Config(base_url="http://server"),
        transport=_scripted([None, None, 503, 200], server_seen),
    )
    gateway = SandboxClient(
        SandboxClient.Config(base_url="http://gateway", transport=_scripted([None, 503], gateway_seen))
    )

    async def wait() -> float:
        try:
            probes = {"server": server.health, "gateway": gateway.answers}
            return await wait_until_up(probes, 5.0, poll_s=0.001)
        finally:
            await server.close()
            await gateway.aclose()

    assert asyncio.run(wait()) >= 0.0
    assert server_seen == ["/health"] * 4  # polled until it answered 200, then no more
    assert gateway_seen == ["/healthz"] * 2  # a degraded gateway answers: its episodes see why


def test_gives_up_after_the_timeout_naming_what_stayed_silent() -> None:
    config = InferenceClient.Config(base_url="http://server")
    server = InferenceClient(config, transport=_scripted([None], []))
    up = asyncio.Event()
    up.set()

    async def answered() -> bool:
        return up.is_set()

    async def wait() -> float:
        try:
            probes = {"the inference server": server.health, "gw": answered}
            return await wait_until_up(probes, 0.05, poll_s=0.01)
        finally:
            await server.close()

    with pytest.raises(ServicesNotReadyError, match=r"^the inference server did not answer within 0.05 s; "
                                                    r"start it or raise inference.wait_ready_s$"):
        asyncio.run(wait())


def test_a_rollout_worker_with_several_gateways_waits_for_one_not_all() -> None:
    """Another host's gateway may be down for good (a lost host): a worker that waited for every
    gateway would never start."""
    up_seen: list[str] = []
    up = SandboxClient(SandboxClient.Config(base_url="http://up", transport=_scripted([None, 200], up_seen)))
    lost = SandboxClient(SandboxClient.Config(base_url="http://lost", transport=_scripted([None], [])))

    async def wait() -> float:
        try:
            probes = {"gateways": GatewayEnvironments([up, lost]).any_answers}
            return await wait_until_up(probes, 5.0, poll_s=0.001)
        finally:
            await up.aclose()
            await lost.aclose()

    assert asyncio.run(wait()) >= 0.0
    assert up_seen == ["/healthz"] * 2
