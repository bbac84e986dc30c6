"""Sandbox sessions across many gateways: placement, failover, renewal and per-gateway load.

`GatewayEnvironments` is the rollout's `EnvironmentFactory` over one or more sandbox gateways
(one per Docker host). Each episode's session goes to the least-loaded gateway that is up and
can serve the task (a `task_dir` needs a gateway whose backend builds task images), among the
`preferred` ones (this host's own) while one of them can take it, else among the others; a gateway that
cannot be reached or answers that it cannot start sessions (5xx, a wedged engine, full) is
marked down for `down_for_s` and the next one is tried. Episodes already on a gateway that dies
fail with the reason (their `exec` raises) and new ones go elsewhere; after `down_for_s` the
gateway is probed (`/healthz`) and used again once it answers.

A session lives as long as the episode's budget allows (`lifetime_s`, at most 12 h) and is
closed by the gateway after `idle_timeout_s` without a request; while the episode runs, a
renewal task touches it every `idle_timeout_s / 3`, so a quiet episode (a long model turn)
keeps its sandbox and a crashed rollout worker's sandboxes go away after the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stacx.rollout.errors import ConfigError, EnvironmentStepError, RewardError
from stacx.rollout.protocols import ExecResult
from stacx.schemas.records import TaskSample

__all__ = [
    "DEFAULT_IMAGE",
    "MAX_LIFETIME_S",
    "GatewayEnvironments",
    "GatewaySession",
]

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "stacx/sandbox:bookworm"
MAX_LIFETIME_S = 12 * 3600.0
"""The longest sandbox (and episode) the product supports."""
DEFAULT_LIFETIME_S = 3600.0
"""Lifetime of a session whose caller names no episode budget."""

Sleep = Callable[[float], Awaitable[None]]


def _gateway_failure(exc: BaseException) -> bool:
    """True for errors that say the gateway (not the request) is the problem: unreachable,
    5xx answers, a wedged engine. Duck-typed on `stacx.sandbox.errors` attributes."""
    if _gateway_full(exc):
        return False
    if getattr(exc, "retriable", False):
        return True
    status = getattr(exc, "status", 0)
    return isinstance(status, int) and status >= 500 and status != 501


def _gateway_full(exc: BaseException) -> bool:
    """The gateway is healthy but runs as many sessions as it may (another worker's, too)."""
    return type(exc).__name__ == "CapacityExceeded"


@dataclass(kw_only=True, slots=True)
class _Gateway:
    """One gateway and what this rollout worker knows about it."""

    url: str
    client: Any
    active: int = 0
    """Sessions of ours open there now."""
    opened: int = 0
    failures: int = 0
    """Gateway failures seen (create, exec, renewal)."""
    down_until: float = 0.0
    """Monotonic time before which it is not used (0: up)."""
    backend: str | None = None
    """Its backend (`docker`, `process`), learnt from /healthz; None until probed."""
    problem: str | None = None
    """Why it was last marked down."""
    waiting: dict[object, float] = field(default_factory=dict)
    """Requests of ours in flight there (create, exec, verify): id -> monotonic start time."""
    creating: int = 0
    """Session creations in flight: they count as load before the session exists."""
    checked_at: float = 0.0
    """When it last answered (or failed) a responsiveness probe."""

    @contextlib.contextmanager
    def request(self, clock: Callable[[], float]) -> Iterator[None]:
        """Note one request in flight while the block runs."""
        token = object()
        self.waiting[token] = clock()
        try:
            yield
        finally:
            del self.waiting[token]

    def oldest_wait(self, now: float) -> float:
        """How long its oldest request in flight has waited (0: none)."""
        return now - min(self.waiting.values()) if self.waiting else 0.0

    def load(self) -> dict[str, Any]:
        return {
            "active": self.active,
            "creating": self.creating,
            "opened": self.opened,
            "failures": self.failures,
            "up": self.problem is None,
            "backend": self.backend,
            "problem": self.problem,
        }


class GatewaySession:
    """One gateway session seen through the `EnvironmentSession` protocol, renewed while open."""

    def __init__(
        self,
        client: Any,
        session_id: str,
        task: TaskSample,
        *,
        renew_every_s: float | None = None,
        sleep: Sleep = asyncio.sleep,
        on_gateway_failure: Callable[[BaseException], None] | None = None,
        on_close: Callable[[], None] | None = None,
        track: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.client = client
        self._track = track or contextlib.nullcontext
        self.session_id = session_id
        self.task = task
        self.num_renewals = 0
        self._sleep = sleep
        self._on_gateway_failure = on_gateway_failure
        self._on_close = on_close
        self._renewal: asyncio.Task[None] | None = None
        if renew_every_s is not None:
            self._renewal = asyncio.create_task(self._renew(renew_every_s), name=f"renew-{session_id}")

    def endpoint(self) -> tuple[str, str | None]:
        """(gateway base URL, bearer token): lets a scaffold process run commands in this session."""
        config = getattr(self.client, "config", None)
        return str(getattr(config, "base_url", "")), getattr(config, "token", None)

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        try:
            with self._track():
                result = await self.client.exec(
                    self.session_id, command, stdin=stdin, timeout_s=timeout_s or 60.0
                )
        except Exception as exc:
            self._failed(exc)
            raise EnvironmentStepError(f"exec in {self.session_id}: {type(exc).__name__}: {exc}") from exc
        return ExecResult(
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            truncated=result.truncated,
            timed_out=result.timed_out,
            duration_ms=int(result.duration_s * 1000),
        )

    async def verify(self) -> dict[str, float]:
        if not self.task.task_dir:
            raise RewardError(
                f"task {self.task.task_id} has no task_dir: the verifier needs a "
                "Harbor task (or configure a reward function)"
            )
        try:
            with self._track():
                result = await self.client.verify_remote(self.session_id)
        except Exception as exc:
            self._failed(exc)
            raise RewardError(f"verifier of {self.task.task_id}: {type(exc).__name__}: {exc}") from exc
        rewards = {k: float(v) for k, v in result.rewards.items()}
        rewards["reward"] = float(result.reward)
        return rewards

    async def close(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None
        try:
            await self.client.close_session(self.session_id)
        finally:
            if self._on_close is not None:
                self._on_close()
                self._on_close = None

    async def _renew(self, every_s: float) -> None:
        """Touch the session every `every_s` until closed; a vanished session ends the loop."""
        while True:
            await self._sleep(every_s)
            try:
                await self.client.touch_session(self.session_id)
                self.num_renewals += 1
            except Exception as exc:
                if getattr(exc, "status", 0) == 404:  # closed or expired: nothing left to renew
                    log.warning("session %s is gone; renewal stops (%s)", self.session_id, exc)
                    return
                self._failed(exc)
                log.warning("renewing session %s failed: %s", self.session_id, exc)

    def _failed(self, exc: BaseException) -> None:
        if self._on_gateway_failure is not None and _gateway_failure(exc):
            self._on_gateway_failure(exc)


class GatewayEnvironments:
    """Opens one session per episode on the least-loaded healthy gateway of `clients`."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        default_image: str = DEFAULT_IMAGE
        """Image of sessions for tasks without task_dir or image."""
        idle_timeout_s: float = 300.0
        """The gateway closes a session after this long without a request (renewal keeps a
        live episode's session); also how soon a crashed worker's sandboxes go away."""
        max_sessions_per_gateway: int | None = None
        """Sessions of ours one gateway takes at most (None: as many as it accepts)."""
        down_for_s: float = 30.0
        """How long a failed gateway is left alone before it is probed again."""
        full_wait_s: float = 600.0
        """When every gateway is up but full, wait (backing off) this long for room before the
        episode fails: a full gateway is back-pressure, not an error."""
        unresponsive_after_s: float = 10.0
        """A gateway whose oldest request of ours has waited this long is asked `/healthz`
        (at most once per this interval); one that does not answer within `health_timeout_s`
        is marked down, and new episodes go elsewhere while its requests wait."""
        health_timeout_s: float = 5.0
        """How long a `/healthz` probe waits for its answer."""
        preferred: tuple[str, ...] = ()
        """Base URLs of the gateways used first (the worker's own host's); the others take
        episodes only while no preferred one is up with room, and are not probed meanwhile."""

        def __post_init__(self) -> None:
            if self.unresponsive_after_s <= 0 or self.health_timeout_s <= 0:
                raise ConfigError(
                    f"sandbox.unresponsive_after_s = {self.unresponsive_after_s}, health_timeout_s = "
                    f"{self.health_timeout_s}; both must be > 0"
                )
            if self.idle_timeout_s <= 0 or self.down_for_s < 0:
                raise ConfigError(
                    f"sandbox.idle_timeout_s = {self.idle_timeout_s}, down_for_s = {self.down_for_s}; "
                    "use idle_timeout_s > 0 and down_for_s >= 0"
                )
            if self.max_sessions_per_gateway is not None and self.max_sessions_per_gateway < 1:
                raise ConfigError(
                    f"sandbox.max_sessions_per_gateway = {self.max_sessions_per_gateway}; use >= 1 or null"
                )

    def __init__(
        self,
        clients: Any,
        config: Config | None = None,
        *,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        clients = list(clients) if isinstance(clients, list | tuple) else [clients]
        if not clients:
            raise ConfigError("sandbox: no gateway configured; set sandbox.url or sandbox.urls")
        self.config = config or GatewayEnvironments.Config()
        self.gateways = [_Gateway(url=_url_of(c, i), client=c) for i, c in enumerate(clients)]
        unknown = sorted(set(self.config.preferred) - {g.url for g in self.gateways})
        if unknown:
            raise ConfigError(f"sandbox.preferred: {unknown} are not among the gateways' urls")
        self._sleep = sleep
        self._clock = clock
        self._probing: dict[str, asyncio.Task[bool]] = {}

    @property
    def client(self) -> Any:
        """The first gateway's client (single-gateway callers)."""
        return self.gateways[0].client

    async def any_answers(self) -> bool:
        """Whether any gateway answers `/healthz` now (start-up: none is marked down; another
        host's may be down for good, so one is enough)."""
        return any(await asyncio.gather(*(g.client.answers() for g in self.gateways)))

    def load(self) -> dict[str, dict[str, Any]]:
        """Per-gateway load: sessions open, opened, failures, up, backend, problem."""
        return {g.url: g.load() for g in self.gateways}

    async def open(
        self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float | None = None
    ) -> GatewaySession:
        lifetime = min(lifetime_s or DEFAULT_LIFETIME_S, MAX_LIFETIME_S)
        spec = self._spec(task, cpus=cpus, memory_mb=memory_mb, lifetime_s=lifetime)
        deadline = self._clock() + self.config.full_wait_s
        delay = 0.25
        while True:
            session, errors, all_full = await self._try_open(task, spec, lifetime)
            if session is not None:
                return session
            if not (all_full and errors) or self._clock() + delay > deadline:
                raise EnvironmentStepError(
                    f"create session for {task.task_id}: no gateway could take it"
                    + (f" ({'; '.join(errors)})" if errors else f" (all down: {self._problems()})")
                )
            await self._sleep(delay)  # every gateway is full: wait for room
            delay = min(delay * 2, 5.0)

    async def _try_open(
        self, task: TaskSample, spec: dict[str, Any], lifetime: float
    ) -> tuple[GatewaySession | None, list[str], bool]:
        """One pass over the candidates: (session, errors, whether every refusal was 'full')."""
        errors: list[str] = []
        all_full = True
        for gateway in await self._candidates(task):
            gateway.creating += 1
            try:
                with gateway.request(self._clock):
                    info = await gateway.client.create_session(**spec)
            except Exception as exc:
                if _gateway_full(exc):  # healthy, just full: try the next one
                    errors.append(f"{gateway.url}: full ({exc})")
                    continue
                if not _gateway_failure(exc):
                    raise EnvironmentStepError(
                        f"create session for {task.task_id} on {gateway.url}: {type(exc).__name__}: {exc}"
                    ) from exc
                self._mark_down(gateway, exc)
                errors.append(f"{gateway.url}: {type(exc).__name__}: {exc}")
                all_full = False
                continue
            finally:
                gateway.creating -= 1
            return self._session(gateway, info, task, lifetime), errors, all_full
        return None, errors, all_full

    def _spec(self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "cpus": cpus,
            "memory_mb": memory_mb,
            "lifetime_s": lifetime_s,
            "idle_timeout_s": min(self.config.idle_timeout_s, lifetime_s),
        }
        if task.task_dir:
            spec["task_dir"] = task.task_dir
        else:
            spec["image"] = task.image or self.config.default_image
        return spec

    def _session(self, gateway: _Gateway, info: Any, task: TaskSample, lifetime_s: float) -> GatewaySession:
        granted = float(info.expires_at) - float(info.created_at)
        if granted < lifetime_s - 60.0:  # the clock starts at the request; a slow start costs seconds
            log.warning(
                "gateway %s caps session lifetime at %.0f s, below the episode budget of %.0f s: "
                "raise its --max-lifetime",
                gateway.url,
                granted,
                lifetime_s,
            )
        gateway.active += 1
        gateway.opened += 1
        idle = float(getattr(info, "idle_timeout_s", self.config.idle_timeout_s))
        return GatewaySession(
            gateway.client,
            info.id,
            task,
            renew_every_s=idle / 3.0,
            sleep=self._sleep,
            on_gateway_failure=lambda exc: self._mark_down(gateway, exc),
            on_close=lambda: self._closed(gateway),
            track=lambda: gateway.request(self._clock),
        )

    @staticmethod
    def _closed(gateway: _Gateway) -> None:
        gateway.active -= 1

    async def _candidates(self, task: TaskSample) -> list[_Gateway]:
        """Gateways that are up (or answer a probe now) and can serve `task`: the preferred ones
        first, then the others, each tier least loaded first. The other tier is probed only when
        no preferred gateway is usable."""
        now = self._clock()
        preferred = set(self.config.preferred)
        tiers = [[g for g in self.gateways if (g.url in preferred) == first] for first in (True, False)]
        ordered: list[_Gateway] = []
        for tier in (t for t in tiers if t):
            if not ordered:
                await self._revive(tier, now)
            ordered += self._usable(tier, task)
        await self._check_waiting(now)
        return [g for g in ordered if g.problem is None]

    async def _revive(self, gateways: list[_Gateway], now: float) -> None:
        """Probe the gateways never probed, and the down ones whose `down_for_s` is over."""
        revived = [g for g in gateways if g.backend is None or (g.problem and now >= g.down_until)]
        if revived:
            await asyncio.gather(*(self._probe(g) for g in revived))

    def _usable(self, gateways: list[_Gateway], task: TaskSample) -> list[_Gateway]:
        limit = self.config.max_sessions_per_gateway
        usable = [
            g
            for g in gateways
            if g.problem is None and (limit is None or g.active + g.creating < limit) and _serves(g, task)
        ]
        return sorted(usable, key=lambda g: (g.active + g.creating, g.opened))

    async def _check_waiting(self, now: float) -> None:
        """Probe the up gateways whose requests have waited `unresponsive_after_s`: a hung one
        (no answer to /healthz either) is marked down instead of drawing every new episode."""
        after = self.config.unresponsive_after_s
        suspects = [
            g
            for g in self.gateways
            if g.problem is None and g.oldest_wait(now) >= after and now - g.checked_at >= after
        ]
        for gateway in suspects:
            gateway.checked_at = now
        if suspects:
            await asyncio.gather(*(self._probe(g) for g in suspects))

    async def _probe(self, gateway: _Gateway) -> bool:
        """One /healthz per gateway at a time, however many episodes ask."""
        task = self._probing.get(gateway.url)
        if task is None:
            task = self._probing[gateway.url] = asyncio.ensure_future(self._health(gateway))
            task.add_done_callback(lambda _: self._probing.pop(gateway.url, None))
        return await asyncio.shield(task)

    async def _health(self, gateway: _Gateway) -> bool:
        try:
            health = await asyncio.wait_for(gateway.client.health(), self.config.health_timeout_s)
        except TimeoutError:
            waited = gateway.oldest_wait(self._clock())
            self._mark_down(
                gateway,
                TimeoutError(
                    f"/healthz did not answer within {self.config.health_timeout_s:g} s"
                    + (f" while a request has waited {waited:.0f} s" if waited else "")
                ),
            )
            return False
        except Exception as exc:
            self._mark_down(gateway, exc)
            return False
        gateway.backend = str(getattr(health, "backend", "") or "unknown")
        problem = getattr(health, "problem", None)
        if problem:
            self._mark_down(gateway, RuntimeError(f"degraded: {problem}"))
            return False
        if gateway.problem is not None:
            log.warning("gateway %s is back", gateway.url)
        gateway.problem = None
        gateway.down_until = 0.0
        return True

    def _mark_down(self, gateway: _Gateway, exc: BaseException) -> None:
        gateway.failures += 1
        if gateway.problem is None:
            log.warning(
                "gateway %s is down (%s: %s); new episodes go elsewhere for %.0f s",
                gateway.url,
                type(exc).__name__,
                exc,
                self.config.down_for_s,
            )
        gateway.problem = f"{type(exc).__name__}: {exc}"[:300]
        gateway.down_until = self._clock() + self.config.down_for_s

    def _problems(self) -> str:
        return "; ".join(f"{g.url}: {g.problem}" for g in self.gateways if g.problem) or "none usable"

    async def aclose(self) -> None:
        for task in list(self._probing.values()):
            task.cancel()


def _serves(gateway: _Gateway, task: TaskSample) -> bool:
    """A task directory needs a backend that builds task images (docker); images run anywhere."""
    return not task.task_dir or gateway.backend in (None, "docker", "unknown")


def _url_of(client: Any, index: int) -> str:
    config = getattr(client, "config", None)
    url = getattr(config, "base_url", None)
    return str(url) if url else f"gateway-{index}"
