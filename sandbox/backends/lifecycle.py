"""Container lifecycle calls (create, start, remove) bounded, timed and watched for a wedged engine.

Docker 20.10 (Debian bookworm's `docker.io`) can deadlock inside libnetwork when many containers
start at once: a `runc create` waits forever in its prestart hook and from then on every engine call
hangs. Two defences live here:

- at most `concurrency` lifecycle calls run at once (exec and file transfers stay wide);
- a call that runs longer than `stuck_after_s` marks the engine wedged: that call and every later
  one fail at once with `EngineWedged` (HTTP 503 at the gateway, naming the stuck call and the fix)
  until a probe of the engine answers again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from stacx.sandbox.errors import EngineWedged

__all__ = ["LifecycleGuard"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class LifecycleGuard:
    """Runs blocking lifecycle calls on a small pool; see the module docstring."""

    def __init__(
        self,
        *,
        engine: str,
        concurrency: int,
        stuck_after_s: float,
        probe: Callable[[], object],
        probe_every_s: float = 5.0,
        hint: str = "",
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"lifecycle concurrency must be >= 1, got {concurrency}")
        self.engine = engine
        self.concurrency = concurrency
        self.stuck_after_s = stuck_after_s
        self._probe = probe
        self._probe_every_s = probe_every_s
        self._hint = hint
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="engine-lifecycle")
        self._probe_pool = ThreadPoolExecutor(2, thread_name_prefix="engine-probe")
        self._inflight: dict[int, tuple[str, float]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wedged: str | None = None
        self._last_probe = 0.0

    @property
    def problem(self) -> str | None:
        """Why the engine is considered wedged, or None."""
        return self._wedged

    def in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    async def run(
        self, what: str, fn: Callable[..., T], *args: Any, undo: Callable[[T], object] | None = None
    ) -> T:
        """`fn(*args)` on the lifecycle pool; EngineWedged when the engine stops answering.

        A thread cannot be cancelled: when the caller gives up (cancelled, or the engine wedged)
        while `fn` runs, `undo(result)` runs as soon as `fn` returns, so nothing it made leaks."""
        await self._check()
        call = _Call(undo)
        future = asyncio.get_running_loop().run_in_executor(self._pool, self._tracked, what, call, fn, *args)
        poll_s = max(0.05, min(1.0, self.stuck_after_s / 4))
        try:
            while True:
                done, _ = await asyncio.wait({future}, timeout=poll_s)
                if done:
                    return future.result()
                stuck = self._oldest_stuck()
                if stuck is not None:
                    raise EngineWedged(self._mark_wedged(*stuck))
        except BaseException:
            future.add_done_callback(_discard_result)
            call.abandon()
            raise

    def _tracked(self, what: str, call: _Call[T], fn: Callable[..., T], *args: Any) -> T:
        key = next(self._ids)
        with self._lock:
            self._inflight[key] = (what, time.monotonic())
        try:
            return call.deliver(fn(*args))
        finally:
            with self._lock:
                del self._inflight[key]

    def _oldest_stuck(self) -> tuple[str, float] | None:
        now = time.monotonic()
        with self._lock:
            calls = sorted(self._inflight.values(), key=lambda call: call[1])
        if calls and now - calls[0][1] > self.stuck_after_s:
            return calls[0][0], now - calls[0][1]
        return None

    def _mark_wedged(self, what: str, age_s: float) -> str:
        message = (
            f"the Docker engine ({self.engine}) is not answering: `{what}` has been running for "
            f"{age_s:.0f}s (limit {self.stuck_after_s:.0f}s).{self._hint}"
        )
        if self._wedged is None:
            log.error("%s", message)
        self._wedged = message
        self._last_probe = time.monotonic()
        return message

    async def _check(self) -> None:
        if self._wedged is None:
            return
        if time.monotonic() - self._last_probe < self._probe_every_s:
            raise EngineWedged(self._wedged)
        self._last_probe = time.monotonic()
        probe = asyncio.get_running_loop().run_in_executor(self._probe_pool, self._probe)
        try:
            await asyncio.wait_for(asyncio.shield(probe), timeout=self._probe_every_s)
        except Exception:
            probe.add_done_callback(_discard_result)
            raise EngineWedged(self._wedged) from None
        if self._oldest_stuck() is None:
            log.warning("the Docker engine (%s) answers again", self.engine)
            self._wedged = None
            return
        raise EngineWedged(self._wedged)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._probe_pool.shutdown(wait=False, cancel_futures=True)


class _Call(Generic[T]):
    """One lifecycle call's hand-over: its result reaches the caller, or `undo` if the caller left."""

    def __init__(self, undo: Callable[[T], object] | None) -> None:
        self._undo = undo
        self._lock = threading.Lock()
        self._abandoned = False
        self._result: tuple[T] | None = None

    def deliver(self, result: T) -> T:
        """In the worker thread, when the call returned."""
        with self._lock:
            self._result = (result,)
            abandoned = self._abandoned
        if abandoned:
            self._run_undo(result)
        return result

    def abandon(self) -> None:
        """In the caller, when it stops waiting."""
        with self._lock:
            self._abandoned = True
            result = self._result
        if result is not None:  # it returned, but the caller left before taking the result
            threading.Thread(target=self._run_undo, args=result, name="engine-undo").start()

    def _run_undo(self, result: T) -> None:
        if self._undo is None:
            return
        try:
            self._undo(result)
        except Exception:
            log.exception("undoing an abandoned lifecycle call failed; the reaper will retry")


def _discard_result(future: asyncio.Future[Any]) -> None:
    """Retrieve the late outcome of an abandoned call so asyncio does not log it as lost."""
    if not future.cancelled():
        future.exception()
