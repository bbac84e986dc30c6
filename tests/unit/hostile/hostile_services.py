"""Fixtures: each service with a 1 MiB body limit and a 1 s read timeout, and the requests the
tests send it (a good one whose answer is deterministic, and where its numbers are)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from stacx.producers import InMemoryPublisher
from stacx.rollout.inference import InferenceServer
from stacx.rollout.proxy import AgentProxy, ProxyServer
from stacx.sandbox.gateway import create_app
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import FakeBackend
from stacx.schemas.http_limits import HttpLimits, uvicorn_options

LIMITS = HttpLimits(max_body_bytes=1 << 20, read_timeout_s=1.0)


@dataclass(kw_only=True)
class Service:
    """A served app and a good request to it whose answer is deterministic."""

    name: str
    base_url: str
    good_path: str
    good_body: dict[str, Any]
    answer: Callable[[Any], Any]
    """The deterministic part of a good answer (no ids, no timings)."""
    app: Any = None
    publisher: InMemoryPublisher | None = None


@pytest.fixture(scope="session")
def server_service(tiny_model_dir: Path) -> Iterator[Service]:
    import torch

    torch.set_num_threads(1)
    server = InferenceServer(InferenceServer.Config(model_path=str(tiny_model_dir), port=0, limits=LIMITS))
    server.start()
    try:
        yield Service(
            name="server",
            base_url=server.base_url,
            good_path="/generate",
            good_body={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
            answer=lambda body: body["output_ids"],
            app=server.app,
        )
    finally:
        server.stop()


@pytest.fixture(scope="session")
def proxy_service(server_service: Service) -> Iterator[Service]:
    publisher = InMemoryPublisher()
    proxy_config = AgentProxy.Config(upstreams=[server_service.base_url], limits=LIMITS)
    proxy = ProxyServer(ProxyServer.Config(proxy=proxy_config, port=0), publisher=publisher)
    proxy.start()
    try:
        yield Service(
            name="proxy",
            base_url=proxy.base_url,
            good_path="/v1/completions",
            good_body={"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0},
            answer=lambda body: body["choices"][0]["text"],
            app=proxy.proxy.app,
            publisher=publisher,
        )
    finally:
        proxy.stop()


@pytest.fixture(scope="session")
def gateway_service() -> Iterator[Service]:
    manager = SessionManager(SessionManager.Config(owner=f"test-{uuid.uuid4().hex[:8]}"), FakeBackend())
    app = create_app(manager, token=None, max_request_bytes=LIMITS.max_body_bytes, read_timeout_s=1.0)
    with serve(app) as url:
        session = httpx.post(f"{url}/v1/sessions", json={"image": "img"}, timeout=30).json()["id"]
        yield Service(
            name="gateway",
            base_url=url,
            good_path=f"/v1/sessions/{session}/exec",
            good_body={"command": "echo hi", "timeout_s": 10},
            answer=lambda body: (body["exit_code"], body["stdout"]),
            app=app,
        )


@pytest.fixture(params=["server", "proxy", "gateway"])
def service(request: pytest.FixtureRequest) -> Service:
    """Each of the three services in turn."""
    found: Service = request.getfixturevalue(f"{request.param}_service")
    return found


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """`app` under uvicorn with `LIMITS` below it, in a daemon thread; yields its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **uvicorn_options(LIMITS)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the app did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
