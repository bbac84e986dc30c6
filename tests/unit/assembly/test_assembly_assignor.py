"""`balance`: the worker that runs the batch stage gets fewer trajectories partitions."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stacx.consumers.assembly import AssemblerApp
from stacx.consumers.assembly.assignor import balance
from stacx.consumers.assembly.errors import AssemblyConfigError

TRAJ, TICKS, CHANGELOG, GROUPS = "traj", "app-ticks", "app-groups-changelog", "app-groups"
STAGE1 = [TRAJ, TICKS, CHANGELOG]


@dataclass
class Member:
    actives: dict[str, list[int]] = field(default_factory=dict)
    standbys: dict[str, list[int]] = field(default_factory=dict)


def _member(partitions: list[int], *, stage2: bool = False, standbys: list[int] | None = None) -> Member:
    member = Member({t: list(partitions) for t in STAGE1}, {t: list(standbys or []) for t in STAGE1})
    if stage2:
        member.actives[GROUPS] = [0]
    return member


def _owned(member: Member) -> set[int]:
    return set(member.actives[TRAJ])


def _check_copartitioned(members: dict[str, Member], partitions: int) -> None:
    """Every stage-1 topic has the same owner per partition, each partition exactly one owner."""
    for member in members.values():
        assert len({tuple(sorted(member.actives[t])) for t in STAGE1}) == 1
    owners = [p for m in members.values() for p in m.actives[TRAJ]]
    assert sorted(owners) == list(range(partitions))


def test_two_workers_split_three_and_stage_two_against_five() -> None:
    members = {"a": _member([0, 1, 2, 3], stage2=True), "b": _member([4, 5, 6, 7])}
    moves = balance(members, stage1_topics=STAGE1, stage2_topic=GROUPS, share=0.25)
    assert moves == 1
    assert len(_owned(members["a"])) == 3 and len(_owned(members["b"])) == 5
    assert members["a"].actives[GROUPS] == [0]  # stage 2 stays where it was
    _check_copartitioned(members, 8)


def test_a_larger_share_moves_more() -> None:
    members = {"a": _member([0, 1, 2, 3], stage2=True), "b": _member([4, 5, 6, 7])}
    balance(members, stage1_topics=STAGE1, stage2_topic=GROUPS, share=0.5)
    # loads: a = n/8 * 0.5 + 0.5, b = (8 - n)/8 * 0.5: n = 0 balances them best
    assert len(_owned(members["a"])) == 0 and len(_owned(members["b"])) == 8
    _check_copartitioned(members, 8)


def test_no_share_or_one_member_keeps_fausts_assignment() -> None:
    members = {"a": _member([0, 1, 2, 3], stage2=True), "b": _member([4, 5, 6, 7])}
    assert balance(members, stage1_topics=STAGE1, stage2_topic=GROUPS, share=0.0) == 0
    assert len(_owned(members["a"])) == 4
    alone = {"a": _member(list(range(8)), stage2=True)}
    assert balance(alone, stage1_topics=STAGE1, stage2_topic=GROUPS, share=0.25) == 0
    assert len(_owned(alone["a"])) == 8


def test_three_workers_no_move_lowers_the_heaviest_load_any_more() -> None:
    members = {
        "a": _member([0, 1, 2], stage2=True),
        "b": _member([3, 4, 5]),
        "c": _member([6, 7]),
    }
    balance(members, stage1_topics=STAGE1, stage2_topic=GROUPS, share=0.25)
    _check_copartitioned(members, 8)
    unit = 0.75 / 8
    loads = {n: len(_owned(m)) * unit + (0.25 if n == "a" else 0) for n, m in members.items()}
    heaviest = max(loads.values())
    assert heaviest < 3 * unit + 0.25  # better than Faust's split
    for source in members:
        for target in members:
            if source != target and _owned(members[source]):
                moved = dict(loads, **{source: loads[source] - unit, target: loads[target] + unit})
                assert max(moved.values()) >= heaviest - 1e-12


def test_a_moved_partitions_standby_changes_place_with_it() -> None:
    members = {
        "a": _member([0, 1, 2, 3], stage2=True, standbys=[4, 5, 6, 7]),
        "b": _member([4, 5, 6, 7], standbys=[0, 1, 2, 3]),
    }
    balance(members, stage1_topics=STAGE1, stage2_topic=GROUPS, share=0.25)
    (moved,) = _owned(members["b"]) - {4, 5, 6, 7}
    for topic in STAGE1:
        assert moved not in members["b"].standbys[topic]
        assert moved in members["a"].standbys[topic]
        assert not set(members["a"].actives[topic]) & set(members["a"].standbys[topic])


def test_the_moved_partition_is_one_the_target_held_before() -> None:
    members = {"a": _member([0, 1, 2, 3], stage2=True), "b": _member([4, 5, 6, 7])}
    balance(members, stage1_topics=STAGE1, stage2_topic=GROUPS, share=0.25, previous={"b": {1, 4}})
    assert _owned(members["b"]) == {1, 4, 5, 6, 7}


@pytest.mark.parametrize("share", [-0.1, 1.0])
def test_the_share_is_checked(share: float) -> None:
    with pytest.raises(AssemblyConfigError, match="batch_stage_share"):
        AssemblerApp.Config(batch_stage_share=share)
