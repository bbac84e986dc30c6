"""`SessionRouter`: pins every session to one inference server.

A session's calls share a prompt prefix, so keeping them on one server keeps its prefix cache
warm, and the session sees one server's weight version at a time. A new session goes to the
server with the fewest calls in flight (ties: fewest pinned sessions, then list order). A
session moves only when its server fails at the transport level (`repin`, counted); pins are
forgotten least-recently-used beyond `max_sessions`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from stacx.rollout.proxy.errors import ProxyConfigError

__all__ = ["SessionRouter"]


class SessionRouter:
    """Session id -> upstream base URL, sticky (see the module docstring)."""

    def __init__(self, upstreams: list[str], max_sessions: int = 100_000) -> None:
        if not upstreams:
            raise ProxyConfigError("upstreams is empty: name at least one inference server URL")
        if max_sessions < 1:
            raise ProxyConfigError(f"max_pinned_sessions={max_sessions}: must be >= 1")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.max_sessions = max_sessions
        self._pins: OrderedDict[str, str] = OrderedDict()
        self._in_flight = dict.fromkeys(self.upstreams, 0)
        self._load = dict.fromkeys(self.upstreams, 0)
        """Pinned sessions per server."""
        self._lock = threading.Lock()
        self.num_repinned = 0

    def pick(self, session_id: str) -> str:
        """The session's server (pinning a new session to the least busy one)."""
        with self._lock:
            pinned = self._pins.get(session_id)
            if pinned is not None:
                self._pins.move_to_end(session_id)
                return pinned
            return self._pin(session_id, exclude=None)

    def repin(self, session_id: str, failed: str) -> str | None:
        """Move the session off `failed`; None when there is no other server."""
        with self._lock:
            if len(self.upstreams) == 1:
                return None
            self.num_repinned += 1
            return self._pin(session_id, exclude=failed)

    @contextmanager
    def in_flight(self, upstream: str) -> Iterator[None]:
        """Count a call on `upstream` while it runs."""
        with self._lock:
            self._in_flight[upstream] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[upstream] -= 1

    @property
    def num_pinned(self) -> int:
        return len(self._pins)

    def _pin(self, session_id: str, exclude: str | None) -> str:
        candidates = [u for u in self.upstreams if u != exclude]
        chosen = min(candidates, key=lambda u: (self._in_flight[u], self._load[u], self.upstreams.index(u)))
        previous = self._pins.pop(session_id, None)
        if previous is not None:
            self._load[previous] -= 1
        self._pins[session_id] = chosen
        self._load[chosen] += 1
        while len(self._pins) > self.max_sessions:
            _, evicted = self._pins.popitem(last=False)
            self._load[evicted] -= 1
        return chosen
