"""RolloutManager: pull task groups, schedule them, run evaluators concurrently within the
resource pool, publish trajectories, follow the policy version with bounded staleness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveInt

from stacx.producers.tracing import span
from stacx.rollout.errors import ConfigError
from stacx.rollout.evaluator import Evaluator
from stacx.rollout.protocols import (
    EnvironmentFactory,
    InferenceClient,
    TaskGroup,
    TaskSource,
    Tokenizer,
    TrajectoryPublisher,
    VersionSource,
)
from stacx.rollout.resources import LocalPool, ResourcePool, Resources, check_feasible
from stacx.rollout.scheduler import TaskScheduler
from stacx.rollout.tokens import out_of_vocabulary
from stacx.schemas.records import Trajectory, TrajectoryStatus, trajectory_id

if TYPE_CHECKING:
    from stacx.rollout.blackbox.capture import CallCapture

__all__ = ["RolloutManager", "RolloutSummary"]

_meter = metrics.get_meter("stacx.rollout")
_EPISODES = _meter.create_counter("stacx.rollout.episodes", unit="{episode}", description="finished episodes")
_STALENESS = _meter.create_histogram(
    "stacx.rollout.staleness", unit="{version}", description="policy versions an episode is behind at its end"
)
_TOKENS = _meter.create_counter("stacx.rollout.generated_tokens", unit="{token}", description="model tokens")
_OUT_OF_VOCABULARY = _meter.create_counter(
    "stacx.rollout.out_of_vocabulary",
    unit="{episode}",
    description="episodes with token ids outside the model's vocabulary (published as FAILED)",
)

log = logging.getLogger(__name__)

DEFAULT_EVALUATOR = "default"
KEEP_ALIVE_S = 1.0
"""While the scheduler is full, how often a consumer-group source is kept alive (`keep_alive`)."""


@dataclass(kw_only=True, slots=True)
class RolloutSummary:
    """What a run produced, per status and per task type."""

    num_groups: int = 0
    num_episodes: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    reward_sum_by_type: dict[str, float] = field(default_factory=dict)
    episodes_by_type: dict[str, int] = field(default_factory=dict)
    rewards_by_task: dict[str, list[float]] = field(default_factory=dict)
    """Every reward per task id (only with `record_task_rewards`)."""
    components_by_task: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """Every episode's reward components per task id, in the order they ended (only with
    `record_task_rewards`): what a benchmark's own metric is computed from."""
    num_publish_errors: int = 0
    num_out_of_vocabulary: int = 0
    """Episodes whose token ids fall outside the model's vocabulary (published as FAILED)."""
    max_concurrent_episodes: int = 0
    wall_s: float = 0.0
    stopped_by: signal.Signals | None = None
    """The signal that stopped the run early (None: it ran to its end)."""

    def mean_reward_by_type(self) -> dict[str, float]:
        return {t: self.reward_sum_by_type[t] / n for t, n in self.episodes_by_type.items() if n}


@dataclass(slots=True, eq=False)
class _Waiting:
    """A group taken from the scheduler whose samples have not all started."""

    group: TaskGroup
    evaluator: Evaluator | None
    started: int = 0
    """Samples started so far (the next one has this index)."""
    bypassed: int = 0
    """Samples of later groups that started while this one did not fit."""

    @property
    def remaining(self) -> int:
        return self.group.num_samples - self.started


class RolloutManager:
    """Runs many evaluators at once; see `run()` and `stop()`."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        model_name: str = "policy"
        """Model name written into every trajectory (and followed on stacx.weights)."""
        max_concurrent_episodes: PositiveInt = 256
        """Episodes running at once (also bounded by the pool)."""
        pool: dict[str, float] = field(
            default_factory=lambda: {
                "sandboxes": 256,
                "cpu": 256.0,
                "memory_mb": 262144,
                "generations": 64,
                "gpus": 0,
            }
        )
        """Global budget: sandboxes, cpu, memory_mb, generations, gpus."""
        evaluators: dict[str, Evaluator.Config] = field(
            default_factory=lambda: {DEFAULT_EVALUATOR: Evaluator.Config()}
        )
        """Evaluator per task type (`default` serves the other types)."""
        scheduler: TaskScheduler.Config = field(default_factory=TaskScheduler.Config)
        """Ordering strategy of pending groups."""
        max_staleness: NonNegativeInt = 1
        """Policy versions by which admitted data may trail the trainer when it is consumed."""
        train_groups_per_version: NonNegativeInt = 0
        """Groups the trainer consumes per policy version; enables the staleness bound (0 = off)."""
        trained_statuses: tuple[str, ...] | None = ("COMPLETED",)
        """Episode statuses the assembler trains on: its `filtering.ok_statuses` under
        `failure_policy: drop`; None when it packs every episode (flag, mask). A group with fewer
        than `min_trained_per_group` such episodes never reaches a batch, so it gives its place
        under the staleness bound back and another group is taken instead."""
        min_trained_per_group: PositiveInt = 1
        """Trained episodes a group needs to reach a batch: the assembler's
        `grouping.min_group_size`, or its `group_size` under `partial_policy: drop`."""
        untrained_backoff_s: NonNegativeFloat = 1.0
        """Under the staleness bound, after such a group wait this long before taking more;
        doubles with each one in a row (a gateway or server that is down fails episodes at
        once), up to `untrained_backoff_max_s`; a group with trained episodes ends the wait."""
        untrained_backoff_max_s: float = 30.0
        """Longest wait after groups that could not reach a batch."""
        staleness_poll_s: float = 0.05
        """How often a stalled manager re-reads the policy version."""
        stall_rebase_s: NonNegativeFloat = 120.0
        """Stalled at the staleness bound this long with no new policy version, the worker gives
        back the groups it admitted that are no longer in flight but were never trained (the
        assembler dropped them as stale, or a batch needed groups a dead peer had in flight) and
        takes more; the assembler's staleness filter still bounds what is trained (0 = never)."""
        rebase_on_takeover: bool = True
        """Give those groups back too when the task source re-serves a departed peer's tasks
        here (a rebalance gave this worker more partitions of the tasks topic)."""
        record_task_rewards: bool = False
        """Keep every reward per task id in the summary (evaluation runs)."""
        publish_failed: bool = True
        """Publish FAILED/TIMED_OUT trajectories too (the assembler excludes them from training)."""
        vocab_size: PositiveInt | None = None
        """Vocabulary size of the trained model: an episode holding a token id outside
        [0, vocab_size) is published as FAILED with the ids in its error, never as trainable, and
        counted (`stacx rollout` reads it from `inference.tokenizer`'s model config when unset;
        None: not checked)."""
        admission_window: PositiveInt = 16
        """Groups taken from the scheduler and waiting for their resources at once: an episode
        that does not fit yet (a scarce GPU) lets later ones that fit start (no head-of-line
        blocking)."""
        max_bypass: NonNegativeInt = 32
        """How many later episodes may start ahead of a waiting group; then dispatch holds
        everything behind it until it fits (big requests are not starved either)."""

        def __post_init__(self) -> None:
            if self.max_concurrent_episodes < 1:
                raise ConfigError(f"max_concurrent_episodes = {self.max_concurrent_episodes}; use >= 1")
            if self.max_staleness < 0:
                raise ConfigError(f"max_staleness = {self.max_staleness}; use >= 0")
            if self.trained_statuses is not None:
                self.trained_statuses = tuple(self.trained_statuses)
            if self.min_trained_per_group < 1:
                raise ConfigError(f"min_trained_per_group = {self.min_trained_per_group}; use >= 1")
            if not 0 <= self.untrained_backoff_s <= self.untrained_backoff_max_s:
                raise ConfigError(
                    f"untrained_backoff_s = {self.untrained_backoff_s}, untrained_backoff_max_s = "
                    f"{self.untrained_backoff_max_s}; use 0 <= untrained_backoff_s <= untrained_backoff_max_s"
                )
            if self.stall_rebase_s < 0:
                raise ConfigError(f"stall_rebase_s = {self.stall_rebase_s}; use >= 0 seconds (0 = never)")
            if not self.evaluators:
                raise ConfigError("evaluators is empty; configure at least `default`")
            if self.vocab_size is not None and self.vocab_size < 1:
                raise ConfigError(f"vocab_size = {self.vocab_size}; use >= 1 or null")
            if self.admission_window < 1 or self.max_bypass < 0:
                raise ConfigError(
                    f"admission_window = {self.admission_window}, max_bypass = {self.max_bypass}; "
                    "use admission_window >= 1 and max_bypass >= 0"
                )

    def __init__(
        self,
        config: Config,
        *,
        source: TaskSource,
        tokenizer: Tokenizer,
        inference: InferenceClient,
        publisher: TrajectoryPublisher,
        sandbox: EnvironmentFactory | None = None,
        versions: VersionSource | None = None,
        capture: CallCapture | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.publisher = publisher
        self.versions = versions
        self.sandbox = sandbox
        self.pool = ResourcePool(Resources.from_mapping(config.pool, where="pool"))
        self.scheduler = TaskScheduler(config.scheduler)
        self.evaluators = {
            name: Evaluator(
                cfg,
                name=name,
                tokenizer=tokenizer,
                inference=inference,
                environments=sandbox,
                global_pool=self.pool,
                model_name=config.model_name,
                capture=capture,
            )
            for name, cfg in config.evaluators.items()
        }
        self.feasibility = check_feasible(self.pool.capacity, [e.demand for e in self.evaluators.values()])
        self.pool.reserve = self.feasibility.reserve
        for cycle in self.feasibility.cycles:
            log.info("%s: keeping %s free of episodes for model calls", cycle, self.pool.reserve)
        self.summary = RolloutSummary()
        self._slots_free = config.max_concurrent_episodes
        self._tasks: set[asyncio.Task[None]] = set()
        self._num_running = 0
        self._remaining: dict[str, int] = {}
        self._window: list[_Waiting] = []
        """Groups taken from the scheduler whose samples have not all started, in pop order."""
        self._source_done = False
        self._wakeup = asyncio.Event()
        """Set when dispatch may make progress: a group pending, resources released, a stop."""
        self._space = asyncio.Event()
        """Set by the dispatcher when it took a group (room for the puller)."""
        self._stopping: str | None = None
        self._stalled = False
        self._stalled_since = 0.0
        """When the current stall began (monotonic)."""
        self._first_version: int | None = None
        """The version the staleness bound counts from (the first seen, or the last rebase)."""
        self._groups_admitted = 0
        self._given_back = 0
        """Admitted groups no longer counted under the bound (given back by rebases)."""
        self._takeovers_seen = 0
        self._revocations_seen = 0
        self.num_rebases = 0
        self.num_dropped_moved = 0
        """Groups taken from the source and dropped before they started: their partition of the
        tasks topic moved to another worker, which runs them."""
        self._trained: dict[str, int] = {}
        """Group id -> its episodes so far with a status the assembler trains on."""
        self.num_untrained_groups = 0
        """Groups that finished with too few trained episodes to reach a batch."""
        self._untrained_in_a_row = 0
        self._hold_until = 0.0
        """No group is taken before this time (monotonic): groups failed in a row."""
        self.num_stalls = 0
        self.num_bypassed = 0
        """Episodes that started ahead of an earlier one that did not fit yet."""
        self._started_at = time.monotonic()
        self.pool.subscribe(self._on_release)

    # -- public API ----------------------------------------------------------------------------

    def policy_version(self) -> int:
        return self.versions.current() if self.versions is not None else 0

    @property
    def num_in_flight(self) -> int:
        return self._num_running

    async def run(self, num_groups: int | None = None) -> RolloutSummary:
        """Roll out `num_groups` groups (all of the source when None); return when all are
        published, or after `stop()`."""
        self._started_at = time.monotonic()
        try:
            await self._dispatch_loop(num_groups)
            if self._stopping == "cancel":
                await self._cancel_all()
            else:
                await self._drain()
        except BaseException:
            await self._cancel_all()
            raise
        self.summary.wall_s = time.monotonic() - self._started_at
        return self.summary

    def stop(self, mode: str = "drain") -> None:
        """Stop pulling; `drain` lets running episodes finish, `cancel` cancels them (their
        sandboxes are closed either way)."""
        if mode not in ("drain", "cancel"):
            raise ConfigError(f"stop mode {mode!r}; use drain or cancel")
        if self._stopping != "cancel":
            self._stopping = mode
        self._wakeup.set()
        if mode == "cancel":
            for task in list(self._tasks):
                task.cancel()

    async def close(self) -> None:
        await self.source.close()
        await self.publisher.close()

    def metrics(self) -> dict[str, Any]:
        """A snapshot for progress output."""
        elapsed = max(time.monotonic() - self._started_at, 1e-9)
        done = self.summary.num_episodes
        return {
            "policy_version": self.policy_version(),
            "in_flight": self.num_in_flight,
            "pending_groups": len(self.scheduler),
            "groups_admitted": self._groups_admitted,
            "untrained_groups": self.num_untrained_groups,
            "episodes_done": done,
            "episodes_per_s": done / elapsed,
            "by_status": dict(self.summary.by_status),
            "mean_reward_by_type": self.summary.mean_reward_by_type(),
            "staleness_stalls": self.num_stalls,
            "staleness_rebases": self.num_rebases,
            "waiting_groups": len(self._window),
            "bypassed": self.num_bypassed,
            "dropped_moved_groups": self.num_dropped_moved,
            "unread_tasks": int(getattr(self.source, "unread_tasks", 0)),
            "pool_in_use": self.pool.in_use.as_dict(),
            "pool_capacity": self.pool.capacity.as_dict(),
            "pool_reserve": self.pool.reserve.as_dict(),
            **self._gateway_load(),
        }

    def _gateway_load(self) -> dict[str, Any]:
        load = getattr(self.sandbox, "load", None)
        return {"gateways": load()} if callable(load) else {}

    # -- dispatch ------------------------------------------------------------------------------
    #
    # One dispatcher coroutine, woken by `_wakeup`. Each round it starts every waiting sample
    # that fits (slots and a local pool, never waiting), and takes the scheduler's next group
    # while slots are free and something could fit. A group that does not fit stays in the
    # window while later ones start, until `max_bypass` of them went ahead of it.

    async def _dispatch_loop(self, num_groups: int | None) -> None:
        puller = asyncio.create_task(self._pull(num_groups))
        try:
            while True:
                self._wakeup.clear()
                self._dispatch_round(num_groups)
                if self._dispatch_done(num_groups):
                    break
                await self._wait_for_wakeup()
        finally:
            puller.cancel()
            await asyncio.gather(puller, return_exceptions=True)

    async def _pull(self, num_groups: int | None) -> None:
        """Keep `lookahead` groups pending (never more than wanted), concurrently with dispatch:
        a stream source may block for a long time without holding back pending work."""
        pulled = 0
        while self._stopping is None and (num_groups is None or pulled - self.num_dropped_moved < num_groups):
            if len(self.scheduler) >= self.config.scheduler.lookahead:
                self._space.clear()
                await self._await_space()
                continue
            group = await self.source.next_group()
            self._drop_moved()
            if group is None:
                break
            self.scheduler.push(group)
            pulled += 1
            self._wakeup.set()
        self._source_done = True
        self._wakeup.set()

    async def _await_space(self) -> None:
        """Wait for room in the scheduler; a source that belongs to a consumer group is kept
        alive meanwhile (`keep_alive`: its rebalances are served, nothing is taken)."""
        keep_alive = getattr(self.source, "keep_alive", None)
        while not self._space.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._space.wait(), KEEP_ALIVE_S)
            if keep_alive is not None and not self._space.is_set():
                await asyncio.to_thread(keep_alive)
                self._drop_moved()

    def _drop_moved(self) -> None:
        """After the source's consumer group took partitions away, drop the groups of those
        partitions that have not started here (pending, or admitted with no sample started):
        their new owner runs them, and they would otherwise run twice."""
        revocations = int(getattr(self.source, "num_revocations", 0))
        if revocations == self._revocations_seen:
            return
        self._revocations_seen = revocations
        owns = self.source.owns  # type: ignore[attr-defined]  # a source that counts revocations has it
        dropped = self.scheduler.drop(lambda group: not owns(group))
        for waiting in [w for w in self._window if not w.started and not owns(w.group)]:
            self._window.remove(waiting)
            self._remaining.pop(waiting.group.group_id, None)
            self._trained.pop(waiting.group.group_id, None)
            self._groups_admitted -= 1
            dropped += 1
        self.num_dropped_moved += dropped
        if dropped:
            log.info("%d groups not started here dropped: their partitions moved to another worker", dropped)
        self._space.set()
        self._wakeup.set()

    def _dispatch_done(self, num_groups: int | None) -> bool:
        if self._window:
            return False
        if self._stopping is not None:
            return True
        if num_groups is not None and self._groups_admitted >= num_groups:
            return True
        return self._source_done and not len(self.scheduler)

    async def _wait_for_wakeup(self) -> None:
        held_s = self._hold_until - time.monotonic()
        if not self._stalled and held_s <= 0:
            await self._wakeup.wait()
            return
        timeout_s = self.config.staleness_poll_s if self._stalled else held_s
        with contextlib.suppress(TimeoutError):  # re-read the policy version, or the hold is over
            await asyncio.wait_for(self._wakeup.wait(), timeout_s)

    def _on_release(self) -> None:
        if self._window:
            self._wakeup.set()

    def _dispatch_round(self, num_groups: int | None) -> None:
        self._drop_unstarted()
        self._drop_moved()
        while self._slots_free:
            capped = self._start_fitting()
            if capped or not self._slots_free or not self._may_take(num_groups):
                return
            group = self.scheduler.pop()
            assert group is not None
            self._space.set()
            self._take(group)

    def _drop_unstarted(self) -> None:
        """On stop: cancel drops every waiting sample; drain those of groups not yet started."""
        if self._stopping is None:
            return
        kept = [w for w in self._window if self._stopping == "drain" and w.started]
        for waiting in self._window:
            if waiting not in kept:
                self._remaining.pop(waiting.group.group_id, None)
                self._trained.pop(waiting.group.group_id, None)
        self._window = kept

    def _start_fitting(self) -> bool:
        """Start every waiting sample that fits, in window order; True when a group that does
        not fit was bypassed `max_bypass` times (nothing behind it may start)."""
        blocked: list[_Waiting] = []
        for waiting in list(self._window):
            while self._slots_free and waiting.remaining and self._try_start(waiting):
                self.num_bypassed += bool(blocked)
                for earlier in blocked:
                    earlier.bypassed += 1
            if not waiting.remaining:
                self._window.remove(waiting)
                continue
            blocked.append(waiting)
            if not self._slots_free or waiting.bypassed >= self.config.max_bypass:
                break
        return any(w.bypassed >= self.config.max_bypass for w in blocked)

    def _may_take(self, num_groups: int | None) -> bool:
        """Whether to take another group from the scheduler now."""
        if self._stopping is not None or not len(self.scheduler):
            return False
        if num_groups is not None and self._groups_admitted >= num_groups:
            return False
        if len(self._window) >= self.config.admission_window or self._is_stalled():
            return False
        if time.monotonic() < self._hold_until:  # groups failed in a row: a service is down
            return False
        # behind a group that does not fit, only take more if some evaluator could start now
        return not self._window or any(
            self.pool.fits(e.demand.local_pool, hold=True) for e in self.evaluators.values()
        )

    def _take(self, group: TaskGroup) -> None:
        self._groups_admitted += 1
        self._remaining[group.group_id] = group.num_samples
        self._trained[group.group_id] = 0
        self._window.append(_Waiting(group=group, evaluator=self._evaluator_for(group)))

    def _stale(self) -> bool:
        """True when data admitted now would trail the trainer by more than max_staleness.

        The bound counts this worker's admitted groups (less those that cannot reach a batch and
        those given back) against the versions since `_first_version`."""
        per_version = self.config.train_groups_per_version
        if not per_version:
            return False
        version = self.policy_version()
        if self._first_version is None:
            self._first_version = version
        steps = version - self._first_version
        return self._counted() >= (steps + self.config.max_staleness + 1) * per_version

    def _counted(self) -> int:
        return self._groups_admitted - self.num_untrained_groups - self._given_back

    def _in_flight_groups(self) -> int:
        """Admitted groups with samples still to publish (a group with a lost sample is never
        acked nor trained: not in flight)."""
        return sum(1 for left in self._remaining.values() if left > 0)

    def _rebase(self, why: str) -> None:
        """Count the bound from the current version, with only the groups still in flight: the
        rest were trained, filtered, or will never be (the assembler's filter is the hard bound)."""
        version = self.policy_version()
        in_flight = self._in_flight_groups()
        given = max(0, self._counted() - in_flight)
        self._given_back += given
        self._first_version = version
        self.num_rebases += 1
        self._stalled_since = time.monotonic()
        log.warning(
            "staleness bound rebased at version %d (%s): %d admitted groups no longer in flight "
            "given back, %d in flight still count",
            version,
            why,
            given,
            in_flight,
        )

    def _maybe_rebase(self) -> None:
        """Rebase after a takeover of a peer's tasks, or a stall with no new version for
        `stall_rebase_s`."""
        if not self.config.train_groups_per_version:
            return
        takeovers = int(getattr(self.source, "num_takeovers", 0))
        if takeovers != self._takeovers_seen:
            self._takeovers_seen = takeovers
            if self.config.rebase_on_takeover:
                self._rebase("a departed peer's tasks are re-served here")
                return
        limit_s = self.config.stall_rebase_s
        if self._stalled and limit_s and time.monotonic() - self._stalled_since >= limit_s:
            self._rebase(f"no new policy version in {limit_s:.0f} s at the bound")

    def _is_stalled(self) -> bool:
        self._maybe_rebase()
        stale = self._stale()
        if stale and not self._stalled:  # a new version ends a stall: each one waits afresh
            self.num_stalls += 1
            self._stalled_since = time.monotonic()
            log.info("staleness bound reached at version %d: waiting for a new policy", self.policy_version())
        self._stalled = stale
        return stale

    def _try_start(self, waiting: _Waiting) -> bool:
        """Start the next sample of `waiting` if its local pool can be drawn now."""
        group, index, evaluator = waiting.group, waiting.started, waiting.evaluator
        local: LocalPool | None = None
        if evaluator is not None:
            local = LocalPool(self.pool, evaluator.demand.local_pool, name=f"{group.group_id}/{index}")
            if not local.try_open():
                return False
        if not waiting.started:
            self.summary.num_groups += 1
        waiting.started += 1
        self._slots_free -= 1
        task = asyncio.create_task(self._episode(evaluator, group, index, local))
        self._tasks.add(task)
        self._num_running += local is not None  # running until its local pool is closed
        self.summary.max_concurrent_episodes = max(self.summary.max_concurrent_episodes, self._num_running)
        # cleanup in a done callback: it runs even for a task cancelled before it started
        task.add_done_callback(lambda done: self._finished(done, local))
        return True

    def _finished(self, task: asyncio.Task[None], local: LocalPool | None) -> None:
        self._tasks.discard(task)
        self._close_local(local)
        self._slots_free += 1
        self._wakeup.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("episode task failed: %r", task.exception())

    def _evaluator_for(self, group: TaskGroup) -> Evaluator | None:
        return self.evaluators.get(group.task.task_type) or self.evaluators.get(DEFAULT_EVALUATOR)

    async def _episode(
        self, evaluator: Evaluator | None, group: TaskGroup, index: int, local: LocalPool | None
    ) -> None:
        version = self.policy_version()
        attributes = _episode_attributes(group, index, version)
        with span("stacx.rollout", "rollout.episode", attributes=attributes) as sp:
            if evaluator is None or local is None:
                trajectory = self._unserved(group, index, version)
            else:
                trajectory = await evaluator.run(group, index, local, policy_version=version)
                self._close_local(local)  # the sandbox is gone: free its budget before publishing
            if sp is not None:
                sp.set_attributes(_trajectory_attributes(trajectory))
            await self._publish(group, trajectory)

    def _close_local(self, local: LocalPool | None) -> None:
        if local is not None and local.close():
            self._num_running -= 1

    def _unserved(self, group: TaskGroup, index: int, version: int) -> Trajectory:
        task = group.task
        return Trajectory(
            trajectory_id=trajectory_id(task.task_id, group.group_id, index, version),
            group_id=group.group_id,
            sample_index=index,
            task_id=task.task_id,
            task_type=task.task_type,
            model_name=self.config.model_name,
            policy_version=version,
            status=TrajectoryStatus.FAILED,
            error=f"no evaluator for task_type {task.task_type!r} and no `default` evaluator",
        )

    async def _publish(self, group: TaskGroup, trajectory: Trajectory) -> None:
        self._check_vocabulary(trajectory)
        self._record(trajectory)
        trained = self.config.trained_statuses
        if group.group_id in self._trained and (trained is None or trajectory.status.value in trained):
            self._trained[group.group_id] += 1
        failed = trajectory.status in (TrajectoryStatus.FAILED, TrajectoryStatus.TIMED_OUT)
        if failed:
            log.warning(
                "episode %s of %s %s: %s",
                trajectory.sample_index,
                group.task.task_id,
                trajectory.status.value,
                trajectory.error,
            )
        if failed and not self.config.publish_failed:
            await self._sample_done(group, ok=True)
            return
        try:
            await self.publisher.publish(trajectory)
        except Exception as exc:  # surfaced, counted, and the group is not acked (redelivered)
            self.summary.num_publish_errors += 1
            log.error("publishing trajectory %s failed: %s", trajectory.trajectory_id, exc)
            await self._sample_done(group, ok=False)
            return
        await self._sample_done(group, ok=True)

    def _check_vocabulary(self, trajectory: Trajectory) -> None:
        """Mark an episode whose token ids the model cannot embed FAILED, saying which ids: the
        trainer would crash on it (an inference server or tokenizer of another model)."""
        vocab_size = self.config.vocab_size
        if vocab_size is None or trajectory.status is not TrajectoryStatus.COMPLETED:
            return
        bad = out_of_vocabulary(trajectory.token_ids, vocab_size)
        if not bad:
            return
        self.summary.num_out_of_vocabulary += 1
        _OUT_OF_VOCABULARY.add(1, {"task_type": trajectory.task_type})
        trajectory.status = TrajectoryStatus.FAILED
        trajectory.error = (
            f"token ids {bad} are outside the vocabulary [0, {vocab_size}) of the trained model "
            "(manager.vocab_size): the inference server or tokenizer belongs to another model"
        )

    def _record(self, trajectory: Trajectory) -> None:
        _EPISODES.add(1, {"status": trajectory.status.value, "task_type": trajectory.task_type})
        _STALENESS.record(max(0, self.policy_version() - trajectory.policy_version))
        _TOKENS.add(int(trajectory.loss_mask.sum()) if len(trajectory.loss_mask) else 0)
        summary = self.summary
        summary.num_episodes += 1
        summary.by_status[trajectory.status.value] = summary.by_status.get(trajectory.status.value, 0) + 1
        task_type = trajectory.task_type
        summary.episodes_by_type[task_type] = summary.episodes_by_type.get(task_type, 0) + 1
        if self.config.record_task_rewards:
            summary.rewards_by_task.setdefault(trajectory.task_id, []).append(trajectory.reward)
            components = {**trajectory.rewards, "reward": trajectory.reward}
            summary.components_by_task.setdefault(trajectory.task_id, []).append(components)
        summary.reward_sum_by_type[task_type] = (
            summary.reward_sum_by_type.get(task_type, 0.0) + trajectory.reward
        )

    async def _sample_done(self, group: TaskGroup, *, ok: bool) -> None:
        if not ok:
            self._remaining[group.group_id] = -(10**9)  # never ack a group with a lost sample
        self._remaining[group.group_id] -= 1
        if self._remaining[group.group_id] == 0:
            del self._remaining[group.group_id]
            self._group_done(group)
            await self.source.ack(group)

    def _group_done(self, group: TaskGroup) -> None:
        """A group whose every episode is published: one the assembler cannot batch no longer
        counts against the staleness bound (the trainer would wait for it forever)."""
        trained = self._trained.pop(group.group_id, None)
        if trained is None:
            return
        if trained >= self.config.min_trained_per_group:
            self._untrained_in_a_row, self._hold_until = 0, 0.0
            return
        self.num_untrained_groups += 1
        self._wakeup.set()
        if not self.config.train_groups_per_version:  # no bound: nothing is taken in its place
            return
        backoff_s = self.config.untrained_backoff_s * 2 ** min(self._untrained_in_a_row, 30)
        self._untrained_in_a_row += 1
        self._hold_until = time.monotonic() + min(backoff_s, self.config.untrained_backoff_max_s)
        log.info(
            "group %s of %s: %d of %d episodes trainable, too few for a batch; another group in %.1f s",
            group.group_id,
            group.task.task_id,
            trained,
            group.num_samples,
            self._hold_until - time.monotonic(),
        )

    # -- shutdown ------------------------------------------------------------------------------

    async def _drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._drain()


def _episode_attributes(group: TaskGroup, index: int, version: int) -> dict[str, Any]:
    return {
        "stacx.task_id": group.task.task_id,
        "stacx.task_type": group.task.task_type,
        "stacx.group_id": group.group_id,
        "stacx.sample_index": index,
        "stacx.policy_version": version,
    }


def _trajectory_attributes(trajectory: Trajectory) -> dict[str, Any]:
    return {
        "stacx.trajectory_id": trajectory.trajectory_id,
        "stacx.status": trajectory.status.value,
        "stacx.reward": float(trajectory.rewards.get("reward", 0.0)) if trajectory.rewards else 0.0,
        "stacx.num_tokens": len(trajectory.token_ids),
    }
