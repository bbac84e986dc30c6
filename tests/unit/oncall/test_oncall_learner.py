"""Readiness policy, promotion gate, and the online learner over in-memory topics."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from oncall_fixtures import call
from safetensors.torch import load_file

from stacx.consumers import InMemoryConsumer
from stacx.consumers.oncall import TrajectoryBuilder
from stacx.producers import InMemoryPublisher
from stacx.schemas.records import Trajectory, WeightVersion
from stacx.trainer import ModelConfig, TrainerConfig
from stacx.trainer.errors import ConfigError
from stacx.trainer.oncall import EvalReport, OnlineLearner, PromotionGate, ReadinessPolicy, audit

TOPIC = "oncall.trajectories"


def test_readiness_fires_on_count_or_on_time_with_enough_pending() -> None:
    policy = ReadinessPolicy(ReadinessPolicy.Config(min_trajectories=4, max_wait_s=10, min_on_timeout=2))
    assert policy.reason(4, 0.0) == "count"
    assert policy.reason(3, 9.9) is None
    assert policy.reason(2, 10.0) == "time"
    assert policy.reason(1, 100.0) is None
    with pytest.raises(ConfigError, match="min_on_timeout"):
        ReadinessPolicy.Config(min_trajectories=2, min_on_timeout=3)


def _report(success: float, probe: float = 0.0, version: int = 1) -> EvalReport:
    return EvalReport(version=version, success_rate=success, probe_rate=probe, num_tasks=10)


def test_gate_rejects_regressions_and_reward_hacking() -> None:
    gate = PromotionGate(PromotionGate.Config(max_success_drop=0.05, max_probe_increase=0.1))
    incumbent = _report(0.5, 0.1)
    assert gate.decide(_report(0.46, 0.1), incumbent).promote
    (why,) = gate.decide(_report(0.4, 0.1), incumbent).reasons
    assert why.startswith("success 0.400")
    hacked = gate.decide(_report(0.9, 0.3), incumbent)  # better score, many broken tool calls
    assert not hacked.promote and "malformed tool calls 0.300" in hacked.reasons[0]


class ScriptedEvaluator:
    """Success rates by version (0 is the baseline)."""

    def __init__(self, rates: dict[int, float]) -> None:
        self.rates = rates
        self.calls: list[int] = []

    def evaluate(self, model_path: str, version: int) -> EvalReport:
        assert Path(model_path, "config.json").is_file()
        self.calls.append(version)
        return _report(self.rates[version], version=version)


class ListWeightLog:
    def __init__(self) -> None:
        self.published: list[WeightVersion] = []

    def latest(self, model_name: str) -> WeightVersion | None:
        return self.published[-1] if self.published else None

    def publish(self, version: WeightVersion) -> None:
        self.published.append(version)

    def close(self) -> None:
        pass


def _trajectories(n: int, start: int = 0) -> list[Trajectory]:
    out = []
    for i in range(start, start + n):
        traj, _ = TrajectoryBuilder().add(None, call(f"s{i}", f"c{i}", [257, 40 + i % 9], [50, 51, 258]))
        out.append(
            traj.to_trajectory(
                sample_index=0,
                reward=float(i % 2),
                rewards={"user": float(i % 2)},
                metadata={"feedback_ids": f"f{i}"},
            )
        )
    return out


def _learner(
    tmp_path: Path, model_dir: Path, publisher: InMemoryPublisher, evaluator: Any, weights: ListWeightLog
) -> OnlineLearner:
    config = OnlineLearner.Config(
        trainer=TrainerConfig(
            recipe="grpo",
            models={"policy": ModelConfig(path=str(model_dir))},
            role_options={"policy": {"kl_beta": 0.0}},
        ),
        state_dir=str(tmp_path / "state"),
        readiness=ReadinessPolicy.Config(
            min_trajectories=4, max_trajectories=4, min_on_timeout=1, max_wait_s=None
        ),
        gate=PromotionGate.Config(max_success_drop=0.0),
    )
    consumer = InMemoryConsumer(publisher, [TOPIC])
    return OnlineLearner(config, evaluator=evaluator, weight_log=weights, consumer=consumer)


def test_learner_trains_when_ready_promotes_better_rejects_worse_and_resumes_without_loss(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    publisher, weights = InMemoryPublisher(), ListWeightLog()
    for t in _trajectories(8):
        publisher.publish(TOPIC, t)
    evaluator = ScriptedEvaluator({0: 0.3, 1: 0.5, 2: 0.4, 3: 0.6})
    learner = _learner(tmp_path, tiny_model_dir, publisher, evaluator, weights)
    learner.run(max_steps=2)
    learner.close()
    assert evaluator.calls == [0, 1, 2]
    assert [(w.version, w.step) for w in weights.published] == [(1, 1)]  # step 2 regressed
    kinds = [e["kind"] for e in learner.history.entries()]
    assert kinds == ["baseline", "promoted", "rejected"]
    deployed = load_file(str(Path(weights.published[0].path) / "model.safetensors"))
    policy = learner.trainer.models["policy"].module.backbone.state_dict()  # type: ignore[union-attr]
    assert all(torch.equal(policy[k], deployed[k]) for k in deployed)  # reset to the deployed v1

    for t in [*_trajectories(2), *_trajectories(4, start=8)]:  # 2 redelivered, 4 new
        publisher.publish(TOPIC, t)
    restarted = _learner(tmp_path, tiny_model_dir, publisher, evaluator, weights)
    assert restarted.trainer.step_count == 2 and evaluator.calls == [0, 1, 2]  # no re-gating
    restarted.run(max_steps=3)
    restarted.close()
    assert [(w.version, w.step) for w in weights.published] == [(1, 1), (2, 3)]
    trained = audit(tmp_path / "state")
    assert trained["steps"] == 3
    assert trained["interaction_ids"] == sorted(f"c{i}" for i in range(12))
    assert trained["interaction_ids_twice"] == [] and trained["feedback_ids_twice"] == []
    assert restarted.source.num_duplicates == 2


class CrashingEvaluator(ScriptedEvaluator):
    """Dies (like a kill) when asked to gate `crash_at`."""

    def __init__(self, rates: dict[int, float], crash_at: int) -> None:
        super().__init__(rates)
        self.crash_at = crash_at

    def evaluate(self, model_path: str, version: int) -> EvalReport:
        if version == self.crash_at:
            raise KeyboardInterrupt
        return super().evaluate(model_path, version)


def test_a_candidate_checkpointed_but_never_exported_is_exported_then_gated_on_restart(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    publisher, weights = InMemoryPublisher(), ListWeightLog()
    for t in _trajectories(4):
        publisher.publish(TOPIC, t)
    learner = _learner(tmp_path, tiny_model_dir, publisher, CrashingEvaluator({0: 0.3}, crash_at=1), weights)
    with pytest.raises(KeyboardInterrupt):
        learner.run(max_steps=1)
    learner.close()
    # a kill between the checkpoint of step 1 and its export: no export, no "published" record
    exports = [p for p in (tmp_path / "state").rglob("v00000001") if p.is_dir()]
    assert len(exports) == 1
    shutil.rmtree(exports[0])
    for marker in (tmp_path / "state").rglob("published"):
        marker.write_text("0")

    evaluator = ScriptedEvaluator({0: 0.3, 1: 0.5})
    restarted = _learner(tmp_path, tiny_model_dir, publisher, evaluator, weights)
    restarted.close()
    assert restarted.trainer.step_count == 1 and evaluator.calls == [1]
    assert (exports[0] / "config.json").is_file()
    assert [(w.version, w.step) for w in weights.published] == [(1, 1)]
