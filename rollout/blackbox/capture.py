"""`CallCapture`: the agent proxy, run inside the rollout engine, keeping each episode's calls.

Black-box scaffolds get `<capture>/s/<episode id>/v1` as their OpenAI base URL. The proxy renders
every call's prompt, generates through the inference server with exact token ids and logprobs,
and records one `AgentInteraction` per call; here those records are kept in memory by episode id
(and optionally also forwarded to `stacx.agent-logs`) until the episode takes them.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from stacx.producers.event_producer import Delivery
from stacx.producers.protocols import Publisher
from stacx.rollout.proxy.app import AgentProxy
from stacx.rollout.proxy.server import ProxyServer
from stacx.schemas.records import AgentInteraction

__all__ = ["CallCapture", "CapturePublisher"]


class CapturePublisher:
    """A `Publisher` that keeps `AgentInteraction`s by episode id (and forwards them if asked)."""

    def __init__(self, forward: Publisher | None = None, max_closed: int = 100_000) -> None:
        self.forward = forward
        self._calls: dict[str, list[AgentInteraction]] = defaultdict(list)
        self._closed: OrderedDict[str, None] = OrderedDict()
        """Episodes already taken: a call that finishes after its scaffold was killed is dropped."""
        self.max_closed = max_closed
        self._lock = threading.Lock()

    def publish(
        self,
        topic: str,
        record: object,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
    ) -> Future[Delivery]:
        if isinstance(record, AgentInteraction):
            episode = record.metadata.get("episode_id") or record.session_id
            with self._lock:
                if episode not in self._closed:
                    self._calls[episode].append(record)
        if self.forward is not None:
            return self.forward.publish(topic, record, key=key, headers=headers)
        done: Future[Delivery] = Future()
        done.set_result(Delivery(topic=topic, partition=0, offset=-1, timestamp_ms=0, record_id=""))
        return done

    def take(self, episode_id: str) -> list[AgentInteraction]:
        """The episode's calls in arrival order (and forget them)."""
        with self._lock:
            self._closed[episode_id] = None
            while len(self._closed) > self.max_closed:
                self._closed.popitem(last=False)
            return self._calls.pop(episode_id, [])

    def flush(self, timeout_s: float | None = None) -> int:
        return self.forward.flush(timeout_s) if self.forward is not None else 0

    def close(self, timeout_s: float | None = None) -> None:
        if self.forward is not None:
            self.forward.close(timeout_s)


class CallCapture:
    """An in-process agent proxy in front of the inference server (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        upstream: str
        """Base URL of the inference server."""
        tokenizer_path: str | None = None
        """Tokenizer directory (None: the server's model_path)."""
        served_model_name: str | None = None
        """Model name shown to scaffolds (None: the server's)."""
        host: str = "127.0.0.1"
        """Interface the proxy listens on (the scaffold processes run on this machine)."""

    def __init__(self, config: Config, *, tokenizer: Any = None, forward: Publisher | None = None) -> None:
        self.config = config
        self.publisher = CapturePublisher(forward)
        proxy = AgentProxy.Config(
            upstreams=[config.upstream],
            tokenizer_path=config.tokenizer_path,
            served_model_name=config.served_model_name,
            agent_name="scaffold",
            exact_continuation=True,
        )
        self.server = ProxyServer(
            ProxyServer.Config(proxy=proxy, host=config.host, port=0),
            publisher=self.publisher,
            tokenizer=tokenizer,
        )
        self.model_name = self.server.proxy.model_name
        self._url: str | None = None

    def start(self) -> str:
        if self._url is None:
            self._url = self.server.start()
        return self._url

    def base_url(self, episode_id: str) -> str:
        """The OpenAI base URL for one episode's scaffold."""
        return f"{self.start()}/s/{episode_id}/v1"

    async def take(self, episode_id: str) -> list[AgentInteraction]:
        """Every call the episode made (waits for records still being handed over)."""
        await asyncio.to_thread(self.server.recorder.flush, 10.0)
        return self.publisher.take(episode_id)

    def close(self) -> None:
        if self._url is not None:
            self.server.stop()
            self._url = None
