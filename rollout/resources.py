"""Two-level resource pools with all-or-nothing acquisition and a whole-config deadlock check.

Level 1: each evaluator (one episode) draws a *local pool* sized to its maximal held demand from
the global budget, all kinds at once or nothing (a *hold*). Level 2: while it runs, the episode
acquires what each step needs from its local pool (`step`) and transient capacity from the global
pool (`generate`, for a model call) and releases it in `finally`.

Where a cycle can form: an episode waits for a `generate` grant while it holds its local pool. If
the kinds `generate` needs are also held by episodes (its own kind: `generations` in `episode`,
`cpu` in `step` and in `generate`; or across evaluators: A holds gpus and waits for cpu, B holds
cpu and waits for gpus), episodes can hold all of a kind while each waits for a model call that
needs it: a hold-and-wait cycle. `check_feasible` looks at every evaluator together, finds those
cycles (strongly connected parts of the graph "X's model call needs a kind Y's episodes hold"),
and either breaks each one with a *reserve* — the largest model call of that kind is kept free of
holds, so a model call can always be granted once the transient holders are done — or, where the
budget cannot hold the reserve beside one episode, refuses the config naming the cycle.
Step acquisitions never exceed the local pool, which nobody else uses; transient holders never
wait before releasing. So with the reserve no cycle remains.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from stacx.rollout.errors import ConfigError, ResourceDeadlockError

__all__ = [
    "EvaluatorDemand",
    "Feasibility",
    "LocalPool",
    "ResourcePool",
    "Resources",
    "check_feasible",
]


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


@dataclass(kw_only=True, slots=True, frozen=True)
class Feasibility:
    """The verdict of `check_feasible` on a configuration it accepts."""

    reserve: Resources = Resources()
    """Kept free of episode holdings so that model calls on a cycle always get through."""
    cycles: tuple[str, ...] = ()
    """The hold-and-wait cycles the reserve breaks, one line each (for logs)."""


def check_feasible(budget: Resources, demands: Iterable[EvaluatorDemand]) -> Feasibility:
    """Check every evaluator of a configuration together; return the reserve that breaks its
    hold-and-wait cycles, or raise `ResourceDeadlockError` naming each demand that can never be
    granted and each cycle the budget cannot break."""
    demands = list(demands)
    problems = [p for d in demands for p in _oversized(budget, d)]
    cycles = _cycles(demands)
    reserve = _reserve(cycles)
    for edge in cycles:
        problems += _unbreakable(budget, reserve, edge, demands)
    if problems:
        raise ResourceDeadlockError(
            "this resource configuration can wait forever: "
            + "; ".join(dict.fromkeys(problems))
            + ". Raise `pool` in the config or lower the evaluators' demands."
        )
    return Feasibility(reserve=reserve, cycles=tuple(dict.fromkeys(e.describe() for e in cycles)))


def _oversized(budget: Resources, demand: EvaluatorDemand) -> list[str]:
    """A local pool or a model call larger than the whole budget can never be granted."""
    problems = []
    for part, amount in (("episode + step", demand.local_pool), ("generate", demand.generate)):
        for kind, needed, available in amount.shortfalls(budget):
            problems.append(
                f"evaluator {demand.name!r} needs {needed:g} {kind} at once ({part}) but the "
                f"global budget has {available:g}"
            )
    return problems


@dataclass(frozen=True, slots=True)
class _Edge:
    """A model call of `waiter` needs `kind`, which episodes of `holder` hold: `path` closes the
    cycle back from `holder` to `waiter` (evaluator names, `holder` first)."""

    waiter: EvaluatorDemand
    holder: EvaluatorDemand
    kind: str
    path: tuple[str, ...]

    def describe(self) -> str:
        chain = " -> ".join(self.path + (self.path[0],)) if len(self.path) > 1 else self.path[0]
        return (
            f"cycle [{chain}]: episodes of {self.holder.name!r} hold {self.kind} while model calls "
            f"of {self.waiter.name!r} wait for {getattr(self.waiter.generate, self.kind):g} {self.kind}"
        )


def _waits_on(waiter: EvaluatorDemand, holder: EvaluatorDemand) -> list[str]:
    """Kinds a model call of `waiter` needs that episodes of `holder` hold."""
    held = holder.local_pool
    return [k for k in _KINDS if getattr(waiter.generate, k) > 0 and getattr(held, k) > 0]


def _cycles(demands: Sequence[EvaluatorDemand]) -> list[_Edge]:
    """Every wait-for edge that lies on a cycle (its holder can reach its waiter again)."""
    edges = {(w.name, h.name): _waits_on(w, h) for w in demands for h in demands if _waits_on(w, h)}
    by_name = {d.name: d for d in demands}
    on_cycle = []
    for (waiter, holder), kinds in edges.items():
        path = _path(holder, waiter, edges)
        if path is not None:
            on_cycle += [_Edge(by_name[waiter], by_name[holder], kind, path) for kind in kinds]
    return on_cycle


def _path(start: str, goal: str, edges: Mapping[tuple[str, str], list[str]]) -> tuple[str, ...] | None:
    """Evaluator names from `start` to `goal` along wait-for edges (breadth first), or None."""
    frontier: deque[tuple[str, ...]] = deque([(start,)])
    seen = {start}
    while frontier:
        path = frontier.popleft()
        if path[-1] == goal:
            return path
        for waiter, holder in edges:
            if waiter == path[-1] and holder not in seen:
                seen.add(holder)
                frontier.append((*path, holder))
    return None


def _reserve(cycles: Iterable[_Edge]) -> Resources:
    """Per kind on a cycle, the largest model call that needs it."""
    amounts: dict[str, float] = {}
    for edge in cycles:
        amounts[edge.kind] = max(amounts.get(edge.kind, 0), getattr(edge.waiter.generate, edge.kind))
    return Resources(**amounts)  # type: ignore[arg-type]


def _unbreakable(
    budget: Resources, reserve: Resources, edge: _Edge, demands: Sequence[EvaluatorDemand]
) -> list[str]:
    """The cycle of `edge` cannot be broken where one episode plus the reserve exceeds the budget."""
    kind = edge.kind
    room, kept = getattr(budget, kind), getattr(reserve, kind)
    problems = []
    for demand in demands:
        held = getattr(demand.local_pool, kind)
        if held > 0 and held + kept > room + 1e-9:
            problems.append(
                f"{edge.describe()}; breaking it needs {kept:g} {kind} kept free for model calls "
                f"beside one episode of {demand.name!r} holding {held:g} (episode + step), but the "
                f"budget has {room:g} {kind}: raise pool.{kind} to {held + kept:g}, or take {kind} "
                "out of `generate` or out of `episode`/`step`"
            )
    return problems


Listener = Callable[[], None]


class ResourcePool:
    """A budget of `Resources` granted all-or-nothing to async waiters.

    Two kinds of grant: a *hold* (an episode's local pool, kept while it waits for other grants)
    must leave `reserve` free of holds; a *transient* grant (a model call, released without
    waiting for anything) may use the reserve. A request that fits is granted at once; waiters
    are served in arrival order, skipping those that do not fit yet.
    """

    def __init__(
        self, capacity: Resources, *, name: str = "global", reserve: Resources | None = None
    ) -> None:
        self.name = name
        self.capacity = capacity
        self.reserve = reserve or Resources()
        self.in_use = Resources()
        self.held = Resources()
        """The part of `in_use` granted as holds."""
        self.peak = Resources()
        self._waiters: deque[tuple[Resources, bool, asyncio.Future[None]]] = deque()
        self._listeners: list[Listener] = []
        self.num_grants = 0

    @property
    def available(self) -> Resources:
        return self.capacity - self.in_use

    def subscribe(self, listener: Listener) -> None:
        """Call `listener()` after every release (e.g. to retry admissions that did not fit)."""
        self._listeners.append(listener)

    def fits(self, demand: Resources, *, hold: bool = False) -> bool:
        """True when `demand` could be granted now."""
        if not demand.fits_in(self.available):
            return False
        return not hold or (self.held + demand + self.reserve).fits_in(self.capacity)

    def try_acquire(self, demand: Resources, *, hold: bool = False) -> bool:
        """Take `demand` now if it fits; never waits."""
        self._check_possible(demand, hold=hold)
        if not self.fits(demand, hold=hold):
            return False
        self._take(demand, hold)
        return True

    async def acquire(self, demand: Resources, *, hold: bool = False) -> None:
        """Wait until all of `demand` fits, then take it atomically."""
        if self.try_acquire(demand, hold=hold):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (demand, hold, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(demand, hold=hold)  # granted while being cancelled: give it back
            else:
                self._waiters.remove(entry)
                self._wake()
            raise

    def release(self, demand: Resources, *, hold: bool = False) -> None:
        remaining = self.in_use - demand
        assert Resources().fits_in(remaining), f"{self.name}: released more than acquired"
        self.in_use = remaining
        if hold:
            self.held = self.held - demand
        self._wake()
        for listener in self._listeners:
            listener()

    @contextlib.asynccontextmanager
    async def lease(self, demand: Resources) -> AsyncIterator[None]:
        """Hold `demand` transiently for the body; released on success, error and cancellation."""
        if demand.is_zero():
            yield
            return
        await self.acquire(demand)
        try:
            yield
        finally:
            self.release(demand)

    def _check_possible(self, demand: Resources, *, hold: bool) -> None:
        limit = self.capacity - self.reserve if hold else self.capacity
        if not demand.fits_in(limit):
            kind, needed, available = demand.shortfalls(limit)[0]
            kept = f", {getattr(self.reserve, kind):g} kept for model calls" if hold else ""
            raise ResourceDeadlockError(
                f"pool {self.name!r}: a request for {needed:g} {kind} can never be granted "
                f"(capacity {getattr(self.capacity, kind):g}{kept})"
            )

    def _take(self, demand: Resources, hold: bool) -> None:
        self.in_use = self.in_use + demand
        if hold:
            self.held = self.held + demand
        assert self.in_use.fits_in(self.capacity), f"{self.name}: over budget"
        if not self.in_use.fits_in(self.peak):
            self.peak = self.peak.join(self.in_use)
        self.num_grants += 1

    def _wake(self) -> None:
        for entry in list(self._waiters):
            demand, hold, future = entry
            if not future.done() and self.fits(demand, hold=hold):
                self._waiters.remove(entry)
                self._take(demand, hold)
                future.set_result(None)


class LocalPool(ResourcePool):
    """An evaluator's own pool, held from the global pool and returned to it on `close()`."""

    def __init__(self, parent: ResourcePool, capacity: Resources, *, name: str) -> None:
        super().__init__(capacity, name=name)
        self.parent = parent
        self._open = False

    async def open(self) -> None:
        await self.parent.acquire(self.capacity, hold=True)
        self._open = True

    def try_open(self) -> bool:
        """Draw the pool now if the parent can grant it; never waits."""
        self._open = self.parent.try_acquire(self.capacity, hold=True)
        return self._open

    def close(self) -> bool:
        """Return the budget to the parent; True the first time only."""
        if not self._open:
            return False
        self._open = False
        self.parent.release(self.capacity, hold=True)
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
