"""The promotion gate: the boundaries of the success drop, the probe rise and the absolute floor."""

from __future__ import annotations

import pytest

from stacx.trainer.errors import ConfigError
from stacx.trainer.oncall.gate import EvalReport, PromotionGate


def _report(success: float, probe: float = 0.0, version: int = 1) -> EvalReport:
    return EvalReport(version=version, success_rate=success, probe_rate=probe, num_tasks=8)


def _gate(**config: float) -> PromotionGate:
    return PromotionGate(PromotionGate.Config(**config))


def test_equal_success_promotes_with_no_drop_allowed() -> None:
    decision = _gate(max_success_drop=0.0).decide(_report(0.5), _report(0.5))
    assert decision.promote and decision.reasons == []


def test_any_drop_beyond_the_allowed_one_is_refused() -> None:
    refused = _gate(max_success_drop=0.0).decide(_report(0.49), _report(0.5))
    assert not refused.promote
    assert refused.reasons == ["success 0.490 < incumbent 0.500 - 0"]
    assert _gate(max_success_drop=0.25).decide(_report(0.25), _report(0.5)).promote  # drop == allowed
    assert not _gate(max_success_drop=0.25).decide(_report(0.24), _report(0.5)).promote
    assert _gate().decide(_report(0.9), _report(0.5)).promote


def test_the_probe_may_rise_by_at_most_its_allowance() -> None:
    gate = _gate(max_probe_increase=0.25)
    assert gate.decide(_report(0.5, probe=0.5), _report(0.5, probe=0.25)).promote  # rise == allowed
    refused = gate.decide(_report(0.5, probe=0.51), _report(0.5, probe=0.25))
    assert not refused.promote
    assert refused.reasons == ["malformed tool calls 0.510 > incumbent 0.250 + 0.25"]
    assert gate.decide(_report(0.5, probe=0.0), _report(0.5, probe=0.25)).promote


def test_the_absolute_floor_refuses_a_candidate_that_beats_a_weak_incumbent() -> None:
    gate = _gate(min_success=0.5)
    refused = gate.decide(_report(0.4), _report(0.1))
    assert not refused.promote and refused.reasons == ["success 0.400 < floor 0.5"]
    assert gate.decide(_report(0.5), _report(0.1)).promote  # at the floor: allowed
    both = _gate(min_success=0.5).decide(_report(0.3, probe=0.5), _report(0.4))
    assert len(both.reasons) == 3 and not both.promote


def test_negative_allowances_are_refused_and_reports_serialise() -> None:
    with pytest.raises(ConfigError, match="must be >= 0"):
        PromotionGate.Config(max_success_drop=-0.1)
    with pytest.raises(ConfigError, match="must be >= 0"):
        PromotionGate.Config(max_probe_increase=-0.1)
    PromotionGate.Config(max_success_drop=0.0, max_probe_increase=0.0)
    report = _report(0.5, probe=0.1, version=3)
    assert report.as_dict() == {
        "version": 3,
        "success_rate": 0.5,
        "probe_rate": 0.1,
        "num_tasks": 8,
        "details": {},
    }
