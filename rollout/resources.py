"""Two-level resource pools with all-or-nothing acquisition and an up-front deadlock check.

Level 1: each evaluator (one episode) draws a *local pool* sized to its maximal held demand from
the global budget, all kinds at once or nothing. Level 2: while it runs, the episode acquires what
each step needs from its local pool (`step`) and transient capacity from the global pool
(`generations` for a model call) and releases it in `finally`.

Why this cannot deadlock: an episode waits for global resources only (a) before it holds anything
(its local pool, acquired atomically) or (b) for a transient grant whose holders never wait for
anything else before releasing it. Step acquisitions never exceed the local pool, which nobody else
uses. So there is no hold-and-wait cycle, provided every single demand fits its pool's capacity:
`check_feasible` verifies exactly that before anything is scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, fields

from rollout.errors import ConfigError, ResourceDeadlockError

__all__ = ["EvaluatorDemand", "LocalPool", "ResourcePool", "Resources", "check_feasible"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Resources:
    """An amount of every resource kind the engine budgets."""

    sandboxes: int = 0
    """Live sandbox sessions."""
    cpu: float = 0.0
    """CPU cores."""
    memory_mb: int = 0
    """Memory in MiB."""
    generations: int = 0
    """Concurrent generate calls to the inference servers."""
    gpus: int = 0
    """GPUs."""

    @classmethod
    def kinds(cls) -> tuple[str, ...]:
        return _KINDS

    @classmethod
    def from_mapping(cls, values: Mapping[str, float] | None, *, where: str) -> Resources:
        """Build from a config mapping, naming `where` in the error for an unknown kind."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(_KINDS))
        if unknown:
            raise ConfigError(f"{where}: unknown resource kind(s) {unknown}; use {list(_KINDS)}")
        for kind, amount in values.items():
            if amount < 0:
                raise ConfigError(f"{where}.{kind} = {amount} is negative; use a value >= 0")
        return cls(**values)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, float]:
        return {kind: getattr(self, kind) for kind in _KINDS}

    # Arithmetic is spelled out per field: it runs several times per episode step.
    def __add__(self, other: Resources) -> Resources:
        return Resources(
            sandboxes=self.sandboxes + other.sandboxes,
            cpu=self.cpu + other.cpu,
            memory_mb=self.memory_mb + other.memory_mb,
            generations=self.generations + other.generations,
            gpus=self.gpus + other.gpus,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            sandboxes=self.sandboxes - other.sandboxes,
            cpu=self.cpu - other.cpu,
            memory_mb=self.memory_mb - other.memory_mb,
            generations=self.generations - other.generations,
            gpus=self.gpus - other.gpus,
        )

    def fits_in(self, capacity: Resources) -> bool:
        """True when every kind of `self` is within `capacity` (with float slack for cpu)."""
        return (
            self.sandboxes <= capacity.sandboxes
            and self.cpu <= capacity.cpu + 1e-9
            and self.memory_mb <= capacity.memory_mb
            and self.generations <= capacity.generations
            and self.gpus <= capacity.gpus
        )

    def shortfalls(self, capacity: Resources) -> list[tuple[str, float, float]]:
        """(kind, needed, available) for every kind where `self` exceeds `capacity`."""
        return [
            (k, getattr(self, k), getattr(capacity, k))
            for k in _KINDS
            if getattr(self, k) > getattr(capacity, k) + 1e-9
        ]

    def is_zero(self) -> bool:
        return not (self.sandboxes or self.cpu or self.memory_mb or self.generations or self.gpus)

    def join(self, other: Resources) -> Resources:
        """Per-kind maximum."""
        return Resources(**{k: max(getattr(self, k), getattr(other, k)) for k in _KINDS})


_KINDS: tuple[str, ...] = tuple(f.name for f in fields(Resources))


@dataclass(kw_only=True, slots=True, frozen=True)
class EvaluatorDemand:
    """What one evaluator (one episode) of a kind needs."""

    name: str
    """Evaluator / task-type name used in error messages."""
    episode: Resources
    """Held for the whole episode (the sandbox and its limits): the local pool drawn from global."""
    step: Resources = Resources()
    """Acquired from the local pool around each environment step."""
    generate: Resources = Resources(generations=1)
    """Acquired from the global pool around each model call (transient)."""

    @property
    def local_pool(self) -> Resources:
        """The local pool: episode holdings, and room for the largest step on top."""
        return self.episode + self.step

    @property
    def maximal(self) -> Resources:
        """Most this evaluator ever holds at once from the global budget."""
        return self.local_pool + self.generate


def check_feasible(budget: Resources, demands: Iterable[EvaluatorDemand]) -> None:
    """Refuse a configuration in which some evaluator's maximal demand exceeds the budget."""
    problems: list[str] = []
    for demand in demands:
        for kind, needed, available in demand.maximal.shortfalls(budget):
            problems.append(
                f"evaluator {demand.name!r} needs {needed:g} {kind} at once "
                f"(episode {getattr(demand.episode, kind):g} + step {getattr(demand.step, kind):g}"
                f" + generate {getattr(demand.generate, kind):g}) but the global budget has "
                f"{available:g}"
            )
    if problems:
        raise ResourceDeadlockError(
            "resource budget can never satisfy these demands (they would wait forever): "
            + "; ".join(problems)
            + ". Raise `pool` in the config or lower the evaluator's demand."
        )


class ResourcePool:
    """A budget of `Resources` granted all-or-nothing to async waiters.

    A request that fits is granted at once; waiters are served in arrival order, skipping those
    that do not fit yet (a large request never blocks small ones: head-of-line blocking across
    kinds would re-introduce the hold-and-wait cycles the two-level design avoids).
    """

    def __init__(self, capacity: Resources, *, name: str = "global") -> None:
        self.name = name
        self.capacity = capacity
        self.in_use = Resources()
        self.peak = Resources()
        self._waiters: deque[tuple[Resources, asyncio.Future[None]]] = deque()
        self.num_grants = 0

    @property
    def available(self) -> Resources:
        return self.capacity - self.in_use

    def try_acquire(self, demand: Resources) -> bool:
        """Take `demand` now if it fits; never waits."""
        self._check_possible(demand)
        if not demand.fits_in(self.available):
            return False
        self._take(demand)
        return True

    async def acquire(self, demand: Resources) -> None:
        """Wait until all of `demand` fits, then take it atomically."""
        self._check_possible(demand)
        if demand.fits_in(self.available):
            self._take(demand)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (demand, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(demand)  # granted while being cancelled: give it back
            else:
                self._waiters.remove(entry)
                self._wake()
            raise

    def release(self, demand: Resources) -> None:
        remaining = self.in_use - demand
        assert Resources().fits_in(remaining), f"{self.name}: released more than acquired"
        self.in_use = remaining
        self._wake()

    @contextlib.asynccontextmanager
    async def lease(self, demand: Resources) -> AsyncIterator[None]:
        """Hold `demand` for the body; released on success, error and cancellation."""
        if demand.is_zero():
            yield
            return
        await self.acquire(demand)
        try:
            yield
        finally:
            self.release(demand)

    def _check_possible(self, demand: Resources) -> None:
        if not demand.fits_in(self.capacity):
            kind, needed, available = demand.shortfalls(self.capacity)[0]
            raise ResourceDeadlockError(
                f"pool {self.name!r}: a request for {needed:g} {kind} can never be granted "
                f"(capacity {available:g})"
            )

    def _take(self, demand: Resources) -> None:
        self.in_use = self.in_use + demand
        assert self.in_use.fits_in(self.capacity), f"{self.name}: over budget"
        if not self.in_use.fits_in(self.peak):
            self.peak = self.peak.join(self.in_use)
        self.num_grants += 1

    def _wake(self) -> None:
        for entry in list(self._waiters):
            demand, future = entry
            if future.done():
                continue
            if demand.fits_in(self.available):
                self._waiters.remove(entry)
                self._take(demand)
                future.set_result(None)


class LocalPool(ResourcePool):
    """An evaluator's own pool, drawn from the global pool and returned to it on `close()`."""

    def __init__(self, parent: ResourcePool, capacity: Resources, *, name: str) -> None:
        super().__init__(capacity, name=name)
        self.parent = parent
        self._open = False

    async def open(self) -> None:
        await self.parent.acquire(self.capacity)
        self._open = True

    def close(self) -> bool:
        """Return the budget to the parent; True the first time only."""
        if not self._open:
            return False
        self._open = False
        self.parent.release(self.capacity)
        return True

    @classmethod
    @contextlib.asynccontextmanager
    async def drawn(cls, parent: ResourcePool, capacity: Resources, *, name: str) -> AsyncIterator[LocalPool]:
        """Draw a local pool for the body, returning it to `parent` however the body ends."""
        pool = cls(parent, capacity, name=name)
        await pool.open()
        try:
            yield pool
        finally:
            pool.close()
