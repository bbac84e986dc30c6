"""`ProxyServer`: the agent proxy as a service (`stacx proxy`): tokenizer, Kafka, HTTP."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from stacx.producers.protocols import Publisher
from stacx.rollout.proxy.app import AgentProxy
from stacx.rollout.proxy.errors import ProxyConfigError, ProxyError
from stacx.rollout.proxy.metrics import ProxyMetrics
from stacx.rollout.proxy.recorder import EventRecorder
from stacx.rollout.proxy.render import DEFAULT_MAX_PROMPT_TOKENS, PromptRenderer
from stacx.schemas.http_limits import uvicorn_options

__all__ = ["ProxyServer", "upstream_model_info"]

log = logging.getLogger(__name__)


def upstream_model_info(base_url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """`GET /get_model_info` of a server, waiting up to `timeout_s` for it to answer."""
    deadline = time.monotonic() + timeout_s
    problem = ""
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base_url.rstrip('/')}/get_model_info", timeout=10)
            if response.status_code == 200:
                body: dict[str, Any] = response.json()
                return body
            problem = f"HTTP {response.status_code}"
        except httpx.TransportError as exc:
            problem = repr(exc)
        time.sleep(0.5)
    raise ProxyConfigError(
        f"upstream {base_url} did not answer /get_model_info within {timeout_s:.0f}s ({problem}); "
        "start the inference server first or fix proxy.upstreams"
    )


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ProxyServer:
    """Runs an `AgentProxy` with uvicorn (in the foreground or in a background thread)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        proxy: AgentProxy.Config
        """Routing, headers, topics, buffer."""
        host: str = "127.0.0.1"
        """Interface to listen on."""
        port: int = 8400
        """TCP port; 0 picks a free one."""
        bootstrap_servers: str | None = None
        """Kafka bootstrap servers (None: $STACX_KAFKA or 127.0.0.1:9092)."""
        producer: dict[str, Any] = field(default_factory=dict)
        """Extra `EventProducer.Config` fields (e.g. delivery_timeout_ms)."""

        def __post_init__(self) -> None:
            if not 0 <= self.port <= 65535:
                raise ProxyConfigError(f"port = {self.port}; use 0..65535")

    def __init__(self, config: Config, publisher: Publisher | None = None, tokenizer: Any = None) -> None:
        self.config = config
        proxy_cfg = config.proxy
        info: dict[str, Any] = {}
        if tokenizer is None or proxy_cfg.served_model_name is None:
            info = upstream_model_info(proxy_cfg.upstreams[0])
        if tokenizer is None:
            tokenizer = _load_tokenizer(
                proxy_cfg.tokenizer_path or str(info.get("tokenizer_path") or info.get("model_path"))
            )
        name = proxy_cfg.served_model_name or str(info.get("served_model_name") or "model")
        self.publisher = publisher if publisher is not None else self._producer()
        self.recorder = EventRecorder(proxy_cfg.recorder, self.publisher, ProxyMetrics())
        context = int(info.get("max_context_length") or DEFAULT_MAX_PROMPT_TOKENS)
        renderer = PromptRenderer(tokenizer, max_tokens=context)
        self.proxy = AgentProxy(proxy_cfg, renderer=renderer, recorder=self.recorder, served_model_name=name)
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None

    def _producer(self) -> Publisher:
        from stacx.producers import EventProducer

        fields: dict[str, Any] = {"client_id": "stacx-proxy", **self.config.producer}
        if self.config.bootstrap_servers:
            fields["bootstrap_servers"] = self.config.bootstrap_servers
        try:
            return EventProducer(EventProducer.Config(**fields))
        except TypeError as exc:
            raise ProxyConfigError(f"proxy producer options: {exc}") from exc

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def _server(self) -> Any:
        if self.config.port == 0:
            self.config.port = _free_port(self.config.host)
        config = uvicorn.Config(
            self.proxy.app,
            host=self.config.host,
            port=self.config.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            **uvicorn_options(self.config.proxy.limits),
        )
        return uvicorn.Server(config)

    def serve_forever(self) -> None:
        """Run until interrupted; then deliver what is buffered (bounded) and close."""
        self._uvicorn = self._server()
        log.info("agent proxy at %s -> %s", self.base_url, ", ".join(self.config.proxy.upstreams))
        try:
            asyncio.run(self._uvicorn.serve())
        finally:
            self.close()

    def start(self, timeout_s: float = 30.0) -> str:
        """Serve from a background thread (tests, demos); returns the base URL."""
        self._uvicorn = self._server()
        self._thread = threading.Thread(target=self._uvicorn.run, name="stacx-proxy-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise ProxyError(f"proxy did not start on {self.base_url}")
            time.sleep(0.02)
        return self.base_url

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.close()

    def close(self, timeout_s: float = 10.0) -> None:
        self.recorder.close(timeout_s)
        self.publisher.close(timeout_s)

    def __enter__(self) -> ProxyServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ProxyConfigError(
            f"cannot load the tokenizer from {path!r} ({exc}); set proxy.tokenizer_path to the "
            "served model's directory"
        ) from exc
