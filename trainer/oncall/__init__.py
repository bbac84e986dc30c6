"""The online learner of on-call RL: readiness policy, promotion gate, rollback. See docs/oncall.md."""

from stacx.trainer.oncall.deploy import Deployments, KafkaWeightLog, VersionHistory, WeightLog
from stacx.trainer.oncall.evaluation import HeldOutEvaluator, load_scorer
from stacx.trainer.oncall.gate import Decision, EvalReport, PromotionGate
from stacx.trainer.oncall.learner import Evaluator, OnlineLearner, audit, trained_manifests
from stacx.trainer.oncall.readiness import ReadinessPolicy
from stacx.trainer.oncall.source import Ledger, ReadyBatchSource, TrajectoryEvents

__all__ = [
    "Decision",
    "Deployments",
    "EvalReport",
    "Evaluator",
    "HeldOutEvaluator",
    "KafkaWeightLog",
    "Ledger",
    "OnlineLearner",
    "PromotionGate",
    "ReadinessPolicy",
    "ReadyBatchSource",
    "TrajectoryEvents",
    "VersionHistory",
    "WeightLog",
    "audit",
    "load_scorer",
    "trained_manifests",
]
