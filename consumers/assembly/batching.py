"""Stage 2: pool closed groups, choose the mixture, pack batches.

Runs on a single partition (the internal groups topic), so the pool and the order of groups
are global and a replay from the same offset rebuilds the same batches. State: `pool` (group
id -> encoded `ReadyGroup`), `index` (model name -> pooled entries in arrival order) and
`packed` (group id -> when it was packed, to ignore redelivered groups; a heap by packing time,
indexed once from the table, lets forgetting touch only the marks that are due). In the worker the pool
and the index are in memory, rebuilt from the groups topic after a restart (`holding`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from stacx.consumers.assembly.claims import decode_trajectory
from stacx.consumers.assembly.envelope import ReadyGroup, decode_group
from stacx.consumers.assembly.errors import AssemblyConfigError
from stacx.consumers.assembly.filters import FailurePolicy, SampleFilter
from stacx.consumers.assembly.mixture import MixturePlanner, PoolEntry
from stacx.consumers.assembly.packing import PackedGroup, pack_batch
from stacx.consumers.assembly.protocols import StateTable
from stacx.consumers.assembly.stats import AssemblyStats, log_dropped
from stacx.schemas.codec import Codec
from stacx.schemas.records import TrainingBatch

__all__ = ["BatchBuilder", "RejectedGroup"]

IndexEntry = list[Any]
"""[group id, task type, num sequences, min policy version]"""


@dataclass(frozen=True, slots=True)
class RejectedGroup:
    """A pooled group that could not be packed (a claim-check blob vanished, a corrupt payload):
    taken out of the pool so the agent goes on; the app dead-letters its samples."""

    group: ReadyGroup
    error: Exception


class BatchBuilder:
    """Pools `ReadyGroup`s per model and emits a `TrainingBatch` whenever the mixture allows."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        packed_ttl_s: float = 24 * 3600.0
        """How long packed group ids are remembered to ignore redelivered groups."""

        def __post_init__(self) -> None:
            if self.packed_ttl_s <= 0:
                raise AssemblyConfigError(
                    f"batching.packed_ttl_s must be > 0 seconds, got {self.packed_ttl_s}"
                )

    def __init__(
        self,
        config: Config,
        *,
        planner: MixturePlanner,
        sample_filter: SampleFilter,
        pool: StateTable[bytes],
        index: StateTable[list[IndexEntry]],
        packed: StateTable[int],
        stats: AssemblyStats,
        codec: Codec | None = None,
    ) -> None:
        self.config = config
        self._codec = codec
        self._planner = planner
        self._filter = sample_filter
        self._pool = pool
        self._index = index
        self._packed = packed
        self._stats = stats
        self._rejected: list[RejectedGroup] = []
        self._packed_order: list[tuple[int, str]] = []
        """Heap of (packed at ms, group id): the marks in the order they expire."""
        self._packed_indexed = False
        """Whether the marks already in `packed` are in the heap."""

    def take_rejected(self) -> list[RejectedGroup]:
        """Groups rejected since the last call (to dead-letter them)."""
        rejected, self._rejected = self._rejected, []
        return rejected

    def on_group(self, payload: bytes, *, now_ms: int) -> list[TrainingBatch]:
        """Pool one encoded `ReadyGroup`; returns the batches that became ready."""
        group = decode_group(payload)
        if group.group_id in self._pool or group.group_id in self._packed:
            self._stats.groups_redelivered += 1
            return []
        if self._filter.is_stale(group.model_name, group.min_policy_version):
            self._stats.groups_dropped += 1
            self._stats.stale += len(group.payloads)
            log_dropped(group.group_id, group.model_name,
                        f"stale on arrival (oldest policy version {group.min_policy_version})")
            return []
        self._pool[group.group_id] = payload
        entry = [group.group_id, group.task_type, group.num_sequences, group.min_policy_version]
        self._index[group.model_name] = [*self._index.get(group.model_name, []), entry]
        return self.drain(group.model_name, now_ms=now_ms)

    def drain(self, model_name: str, *, now_ms: int) -> list[TrainingBatch]:
        """Emit every batch the pool of `model_name` can fill now."""
        self._evict_stale(model_name)
        batches: list[TrainingBatch] = []
        while True:
            entries = [PoolEntry(e[0], e[1], e[2]) for e in self._index.get(model_name, [])]
            chosen = self._planner.select(entries)
            if chosen is None:
                break
            batch = self._emit(model_name, chosen, now_ms=now_ms)
            if batch is not None:  # None: a group was rejected; plan again without it
                batches.append(batch)
        if batches:
            self._forget_packed(now_ms)
        return batches

    def _emit(self, model_name: str, chosen: list[PoolEntry], *, now_ms: int) -> TrainingBatch | None:
        packed: list[PackedGroup] = []
        rejected: list[str] = []
        for entry in chosen:
            try:
                packed.append(_decoded(decode_group(self._pool[entry.key]), self._codec))
            except Exception as exc:  # a vanished blob must not stop the agent: reject the group
                self._reject(entry.key, exc)
                rejected.append(entry.key)
        if rejected:
            self._remove(model_name, set(rejected), now_ms)
            return None
        batch = pack_batch(
            packed,
            model_name=model_name,
            mask_flagged=self._filter.config.failure_policy is FailurePolicy.MASK,
        )
        self._remove(model_name, {e.key for e in chosen}, now_ms)
        return batch

    def _remove(self, model_name: str, keys: set[str], now_ms: int) -> None:
        """Take `keys` out of the pool; remembered as packed, so a redelivery is ignored."""
        for key in keys:
            del self._pool[key]
            self._packed[key] = now_ms
            heapq.heappush(self._packed_order, (now_ms, key))
        self._index[model_name] = [e for e in self._index[model_name] if e[0] not in keys]

    def _reject(self, key: str, exc: Exception) -> None:
        try:
            group = decode_group(self._pool[key])
        except Exception:  # the envelope itself is corrupt: keep its bytes as the only payload
            group = ReadyGroup(
                group_id=key,
                model_name="",
                task_type="",
                group_size=0,
                min_policy_version=0,
                payloads=[self._pool[key]],
            )
        self._rejected.append(RejectedGroup(group=group, error=exc))
        self._stats.groups_rejected += 1

    def _evict_stale(self, model_name: str) -> None:
        entries = self._index.get(model_name, [])
        fresh = [e for e in entries if not self._filter.is_stale(model_name, e[3])]
        if len(fresh) == len(entries):
            return
        for entry in entries:
            if entry not in fresh:
                del self._pool[entry[0]]
                self._stats.groups_dropped += 1
                log_dropped(entry[0], model_name,
                            f"went stale in the pool (oldest policy version {entry[3]})")
        self._index[model_name] = fresh

    def _forget_packed(self, now_ms: int) -> None:
        """Forget the marks older than `packed_ttl_s` (only the due ones are touched)."""
        if not self._packed_indexed:  # marks written before this builder (a restart, a takeover)
            for key, at in list(self._packed.items()):
                heapq.heappush(self._packed_order, (at, key))
            self._packed_indexed = True
        horizon_ms = now_ms - self.config.packed_ttl_s * 1000
        while self._packed_order and self._packed_order[0][0] <= horizon_ms:
            at, key = heapq.heappop(self._packed_order)
            if self._packed.get(key) == at:
                del self._packed[key]

    def forget_marks_order(self) -> None:
        """The packed table may have changed under this builder (its partition moved): index the
        marks again from the table on the next pass."""
        self._packed_order.clear()
        self._packed_indexed = False


def _decoded(group: ReadyGroup, codec: Codec | None) -> PackedGroup:
    return PackedGroup(
        group_id=group.group_id,
        trajectories=[decode_trajectory(p, codec) for p in group.payloads],
        group_size=group.group_size,
        pad_to=group.pad_to,
        flagged_ids=frozenset(group.flagged_ids),
    )
