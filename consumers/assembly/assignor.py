"""Partition assignment that weighs the batch stage.

Faust assigns each set of co-partitioned topics on its own and evenly: with 8 trajectories
partitions and two workers each gets 4, and one of them also gets the single partition of the
groups topic, so it runs the batch stage (stage 2) on top of its half of stage 1. Stage 2 takes
about a quarter of the assembler's CPU, so that worker does ~60 % of the work and bounds the
pair's throughput while the other idles.

`balance` moves stage-1 partitions (each with every topic co-partitioned with it: the ticks
topic and the table changelogs) away from the member that holds stage 2 until no move lowers the
heaviest member's load, where a member's load is

    load = (stage-1 partitions / P) * (1 - share) + share * (holds stage 2)

and `share` is the batch stage's part of the work (`AssemblerApp.Config.batch_stage_share`).
With P = 8, two workers and share 0.25 the split is 3 + stage 2 against 5. A moved partition
goes to the lightest member, preferring one that held it in the previous assignment (its
standby copy, if any, changes place with the active one), so repeated rebalances move little.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Protocol

from faust.assignor import PartitionAssignor

__all__ = ["Assignment", "BalancingAssignor", "balance", "make_assignor"]


class Assignment(Protocol):
    """What `balance` reads and changes of a member's assignment (Faust's `ClientAssignment`)."""

    actives: MutableMapping[str, list[int]]
    standbys: MutableMapping[str, list[int]]


def balance(
    assignments: Mapping[str, Assignment],
    *,
    stage1_topics: Sequence[str],
    stage2_topic: str,
    share: float,
    previous: Mapping[str, set[int]] | None = None,
) -> int:
    """Move stage-1 partitions off the stage-2 member while that lowers the heaviest load.

    `stage1_topics`: the trajectories topic and every topic co-partitioned with it (moved
    together); `previous`: the stage-1 partitions each member held before. Returns the moves."""
    if not stage1_topics or share <= 0 or len(assignments) < 2:
        return 0
    first = stage1_topics[0]
    owned = {member: set(a.actives.get(first, [])) for member, a in assignments.items()}
    total = sum(len(parts) for parts in owned.values())
    if total < 2:
        return 0
    unit = (1.0 - share) / total
    heavy = {member for member, a in assignments.items() if a.actives.get(stage2_topic)}

    def load(member: str) -> float:
        return len(owned[member]) * unit + (share if member in heavy else 0.0)

    moves = 0
    while True:
        source = max(sorted(owned), key=load)
        target = min(sorted(owned), key=load)
        if source == target or not owned[source]:
            return moves
        if max(load(source) - unit, load(target) + unit) >= load(source) - 1e-12:
            return moves
        partition = _pick(owned[source], (previous or {}).get(target, set()))
        for topic in stage1_topics:
            _move(assignments[source], assignments[target], topic, partition)
        owned[source].discard(partition)
        owned[target].add(partition)
        moves += 1


def _pick(candidates: set[int], preferred: set[int]) -> int:
    """The partition to move: one the target held before, else the highest numbered."""
    again = candidates & preferred
    return max(again or candidates)


def _move(source: Assignment, target: Assignment, topic: str, partition: int) -> None:
    """Make `target` the active owner of `topic`'s `partition`; a standby copy the target held
    goes to the source, which has the state."""
    source.actives[topic] = [p for p in source.actives.get(topic, []) if p != partition]
    target.actives[topic] = sorted({*target.actives.get(topic, []), partition})
    if partition in target.standbys.get(topic, []):
        target.standbys[topic] = [p for p in target.standbys[topic] if p != partition]
        source.standbys[topic] = sorted({*source.standbys.get(topic, []), partition})


class BalancingAssignor(PartitionAssignor):
    """Faust's assignor followed by `balance` (class attributes set by `make_assignor`)."""

    trajectories_topic = ""
    stage2_topic = ""
    share = 0.0

    def _perform_assignment(self, cluster: Any, member_metadata: Any) -> Any:
        self._previous = {
            member: set(self._get_client_metadata(meta).assignment.actives.get(self.trajectories_topic, []))
            for member, meta in member_metadata.items()
        }
        return super()._perform_assignment(cluster, member_metadata)

    def _global_table_standby_assignments(self, assignments: Any, partitions_by_topic: Any) -> Any:
        count = partitions_by_topic.get(self.trajectories_topic)
        if count is not None and count > 1:
            stage1 = [self.trajectories_topic] + sorted(
                t for t, n in partitions_by_topic.items() if n == count and t != self.trajectories_topic
            )
            balance(
                assignments,
                stage1_topics=stage1,
                stage2_topic=self.stage2_topic,
                share=self.share,
                previous=getattr(self, "_previous", None),
            )
        return super()._global_table_standby_assignments(assignments, partitions_by_topic)


def make_assignor(trajectories_topic: str, stage2_topic: str, share: float) -> type[BalancingAssignor]:
    """A `BalancingAssignor` class for one app (Faust instantiates the class it is given)."""
    return type(
        "BalancingAssignor",
        (BalancingAssignor,),
        {"trajectories_topic": trajectories_topic, "stage2_topic": stage2_topic, "share": share},
    )
