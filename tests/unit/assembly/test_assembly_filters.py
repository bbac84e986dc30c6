"""The per-sample filter: staleness by the oldest weights behind any token, failure policies."""

from __future__ import annotations

import dataclasses

import pytest

from stacx.consumers.assembly.errors import AssemblyConfigError
from stacx.consumers.assembly.filters import (
    FailurePolicy,
    SampleFilter,
    Verdict,
    invalid_reason,
    oldest_policy_version,
)
from stacx.consumers.assembly.testing import make_trajectory
from stacx.schemas.records import Trajectory, TrajectoryStatus, Turn, logprobs, loss_mask, token_ids


def _with_turn_versions(trajectory: Trajectory, *versions: int | None) -> Trajectory:
    turns = [Turn(role="assistant", text="", policy_version=v) for v in versions]
    return dataclasses.replace(trajectory, turns=turns)


def _filter(latest: int | None = 10, **config: object) -> SampleFilter:
    versions = {} if latest is None else {"policy": latest}
    return SampleFilter(SampleFilter.Config(**config), versions)  # type: ignore[arg-type]


def test_the_oldest_version_is_the_oldest_turn_not_the_trajectory_label() -> None:
    traj = _with_turn_versions(make_trajectory("g", 0, policy_version=9), 9, 3, None, 8)
    assert oldest_policy_version(traj) == 3
    assert oldest_policy_version(make_trajectory("g", 0, policy_version=9)) == 9
    # a turn newer than the label does not make the sample newer
    assert oldest_policy_version(_with_turn_versions(make_trajectory("g", 0, policy_version=5), 7)) == 5


def test_a_sample_with_one_stale_turn_is_dropped_as_stale() -> None:
    fresh_label = make_trajectory("g", 0, policy_version=10)
    sample_filter = _filter(latest=10, max_staleness=4)
    assert sample_filter.verdict(fresh_label) is Verdict.KEEP
    assert sample_filter.verdict(_with_turn_versions(fresh_label, 10, 5)) is Verdict.DROP_STALE
    assert sample_filter.verdict(_with_turn_versions(fresh_label, 10, 6)) is Verdict.KEEP  # lag 4: allowed


def test_lag_and_staleness_limits() -> None:
    sample_filter = _filter(latest=10, max_staleness=2)
    assert sample_filter.lag("policy", 7) == 3 and sample_filter.lag("policy", 12) == 0
    assert sample_filter.lag("other-model", 0) == 0  # no weights seen for it: nothing is stale
    assert sample_filter.is_stale("policy", 7) and not sample_filter.is_stale("policy", 8)
    assert not _filter(latest=10, max_staleness=None).is_stale("policy", 0)
    assert not _filter(latest=None, max_staleness=0).is_stale("policy", 0)
    assert _filter(latest=1, max_staleness=0).is_stale("policy", 0)
    assert not _filter(latest=1, max_staleness=0).is_stale("policy", 1)
    assert SampleFilter.Config(max_staleness=0).max_staleness == 0
    with pytest.raises(AssemblyConfigError, match="max_staleness must be >= 0"):
        SampleFilter.Config(max_staleness=-1)


@pytest.mark.parametrize(
    ("policy", "verdict"),
    [("drop", Verdict.DROP_FAILED), ("flag", Verdict.FLAG), ("mask", Verdict.FLAG)],
)
def test_failed_samples_follow_the_failure_policy(policy: str, verdict: Verdict) -> None:
    failed = make_trajectory("g", 0, policy_version=10, status=TrajectoryStatus.FAILED)
    sample_filter = _filter(failure_policy=policy)
    assert sample_filter.config.failure_policy is FailurePolicy(policy)
    assert sample_filter.verdict(failed) is verdict
    assert sample_filter.verdict(make_trajectory("g", 1, policy_version=10)) is Verdict.KEEP


def test_ok_statuses_and_trainable_verdicts() -> None:
    timed_out = make_trajectory("g", 0, policy_version=10, status=TrajectoryStatus.TIMED_OUT)
    lenient = _filter(ok_statuses=["COMPLETED", "TIMED_OUT"])
    assert lenient.config.ok_statuses == ("COMPLETED", "TIMED_OUT")
    assert lenient.verdict(timed_out) is Verdict.KEEP
    assert _filter().verdict(timed_out) is Verdict.DROP_FAILED
    # staleness is decided before the status: a stale failed sample is stale
    stale_failed = make_trajectory("g", 0, policy_version=0, status=TrajectoryStatus.FAILED)
    assert _filter(latest=10, max_staleness=4).verdict(stale_failed) is Verdict.DROP_STALE
    assert [v for v in Verdict if v.trainable] == [Verdict.KEEP, Verdict.FLAG]


def test_invalid_reason_names_every_problem() -> None:
    assert invalid_reason(make_trajectory("g", 0)) is None
    no_group = dataclasses.replace(make_trajectory("g", 0), group_id="")
    assert invalid_reason(no_group) == "group_id is empty"
    broken = dataclasses.replace(make_trajectory("g", 0), group_id="", loss_mask=[1])
    reason = invalid_reason(broken)
    assert reason is not None and "; group_id is empty" in reason and reason.index("group_id") > 0


def _with_ids(*ids: int) -> Trajectory:
    n = len(ids)
    base = make_trajectory("g", 0)
    return dataclasses.replace(
        base,
        token_ids=token_ids(ids),
        loss_mask=loss_mask([0] * n),
        logprobs=logprobs([0.0] * n),
        prompt_length=n,
    )


def test_vocabulary_bounds_are_half_open_and_the_reason_names_the_ids() -> None:
    inside = _with_ids(0, 1, 7)
    assert invalid_reason(inside, vocab_size=8) is None  # 0 and vocab_size - 1 are in range
    assert invalid_reason(_with_ids(0, 8, 3), vocab_size=8) == (
        "token ids [8] are outside the vocabulary [0, 8) of filtering.vocab_size "
        "(tokenized for another model)"
    )
    assert invalid_reason(_with_ids(-1, 2), vocab_size=8) == (
        "token ids [-1] are outside the vocabulary [0, 8) of filtering.vocab_size "
        "(tokenized for another model)"
    )
    # the first five distinct bad ids, sorted; good ids are not listed
    many = _with_ids(20, 9, 9, 0, 15, 11, 30, 12, 5)
    reason = invalid_reason(many, vocab_size=8)
    assert reason is not None and reason.startswith("token ids [9, 11, 12, 15, 20] are outside")
    assert invalid_reason(_with_ids(0, 8), vocab_size=None) is None  # not checked without a size


def test_a_plain_string_status_is_judged_like_the_enum() -> None:
    keep = dataclasses.replace(make_trajectory("g", 0, policy_version=10), status="COMPLETED")
    failed = dataclasses.replace(make_trajectory("g", 0, policy_version=10), status="FAILED")
    assert _filter().verdict(keep) is Verdict.KEEP  # type: ignore[arg-type]
    assert _filter().verdict(failed) is Verdict.DROP_FAILED  # type: ignore[arg-type]
