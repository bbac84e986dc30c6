"""`OnlineLearner`: the long-running on-call trainer (`stacx oncall CONFIG`).

Loop: the `ReadyBatchSource` turns rewarded trajectories into a batch when the readiness policy
fires; `StacxTrainer` trains one step, exports the candidate, checkpoints (weights, optimizer,
step, consumer offsets) and commits the offsets; then the candidate is evaluated on the held-out
set and the promotion gate decides: promoted versions are announced on the weights topic (the
serving fleet follows it), rejected ones are recorded with the reasons. Every decision goes to
`<state_dir>/versions.jsonl`.

Crash safety: a step is either in the checkpoint (then its offsets are committed and its batch
is in the checkpoint's trained ids, with its manifest in the ledger) or it is replayed. A
candidate checkpointed but not yet gated when the learner died is gated on restart. A rollback
(`stacx oncall-rollback`) makes the learner continue from the rolled-back weights.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stacx.schemas import topics
from stacx.schemas.records import export_dir_name
from stacx.trainer.config import TrainerConfig
from stacx.trainer.engine import StacxTrainer, StepResult
from stacx.trainer.errors import ConfigError
from stacx.trainer.oncall.deploy import Deployments, VersionHistory, WeightLog
from stacx.trainer.oncall.gate import EvalReport, PromotionGate
from stacx.trainer.oncall.readiness import ReadinessPolicy
from stacx.trainer.oncall.source import Ledger, ReadyBatchSource, TrajectoryEvents

__all__ = ["Evaluator", "OnlineLearner", "audit", "trained_manifests"]

log = logging.getLogger(__name__)


class Evaluator(Protocol):
    """Scores a weights directory on the held-out set (`HeldOutEvaluator`, a fake in tests)."""

    def evaluate(self, model_path: str, version: int) -> EvalReport: ...


def _bootstrap() -> str:
    return topics.default_bootstrap()


class OnlineLearner:
    """See the module docstring."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        trainer: TrainerConfig
        """Recipe, models, optimizer (its checkpoint/export dirs are set under `state_dir`)."""
        state_dir: str
        """Checkpoints, exported candidates, the ledger and versions.jsonl."""
        model_name: str = "policy"
        """Name of the deployed model on the weights topic (what the servers follow)."""
        bootstrap_servers: str = field(default_factory=_bootstrap)
        """Kafka bootstrap servers."""
        trajectories_topic: str = topics.ONCALL_TRAJECTORIES
        """Rewarded trajectories from the join (one partition)."""
        weights_topic: str = topics.WEIGHTS
        """Where promoted versions are announced."""
        group_id: str = "stacx-oncall-learner"
        """Consumer group: its committed offsets are the learner's progress."""
        readiness: ReadinessPolicy.Config = field(default_factory=ReadinessPolicy.Config)
        """When to train."""
        gate: PromotionGate.Config = field(default_factory=PromotionGate.Config)
        """When a candidate may be deployed."""
        reset_on_reject: bool = True
        """After a rejection, continue training from the deployed weights (the data comes from
        them; a learner drifting away on rejected weights trains further and further
        off-policy). False: keep the rejected weights."""

        def trainer_config(self) -> TrainerConfig:
            """The trainer section with checkpoints and exports under `state_dir` (every step,
            checkpoint before gating, exports kept for rollbacks, nothing announced by the
            trainer itself: the gate announces)."""
            root = Path(self.state_dir)
            return dataclasses.replace(
                self.trainer,
                checkpoint=dataclasses.replace(
                    self.trainer.checkpoint, dir=str(root / "checkpoints"), every_steps=1, resume=True
                ),
                export=dataclasses.replace(
                    self.trainer.export,
                    dir=str(root / "exports"),
                    every_steps=1,
                    publish=False,
                    keep_last=None,
                ),
            )

    def __init__(
        self,
        config: Config,
        *,
        evaluator: Evaluator,
        weight_log: WeightLog,
        consumer: TrajectoryEvents | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.stop = stop or threading.Event()
        self.evaluator = evaluator
        self.gate = PromotionGate(config.gate)
        root = Path(config.state_dir)
        self.history = VersionHistory(root / "versions.jsonl")
        self.ledger = Ledger(root / "ledger")
        self.deployments = Deployments(self.history, weight_log, config.model_name)
        self.trainer_config = config.trainer_config()
        trained = trained_manifests(root)
        self.source = ReadyBatchSource(
            consumer or self._consumer(),
            ReadinessPolicy(config.readiness),
            self.ledger,
            model_name=config.model_name,
            trained_trajectory_ids=[t for m in trained for t in m["trajectory_ids"]],
            stop=self.stop,
        )
        self.trainer = StacxTrainer(
            self.trainer_config, source=self.source, publisher=None, on_step=self._after_step
        )
        self._rollbacks_seen = self._num_rollbacks()
        self.incumbent, self.incumbent_path = self._incumbent()
        self._gate_unfinished()
        self._reset_after_restart()

    def _consumer(self) -> TrajectoryEvents:
        from stacx.consumers import EventConsumer

        return EventConsumer(
            EventConsumer.Config(
                bootstrap_servers=self.config.bootstrap_servers,
                group_id=self.config.group_id,
                topics=[self.config.trajectories_topic],
                client_id="stacx-oncall-learner",
            )
        )

    def run(self, max_steps: int | None = None) -> None:
        """Train until `stop` is set (or `max_steps` steps in total)."""
        self.trainer.run(max_steps)

    def close(self) -> None:
        self.trainer.close()

    # -- the gate ------------------------------------------------------------------------------

    def _incumbent(self) -> tuple[EvalReport, str]:
        for entry in reversed(self.history.entries()):
            if entry["kind"] in ("baseline", "promoted", "rollback") and entry.get("report"):
                return EvalReport(**entry["report"]), str(entry["path"])
        base = self.trainer_config.models["policy"].path
        if base is None:
            raise ConfigError(
                "oncall: trainer.models.policy.path must be the deployed model's "
                "directory (the baseline the gate compares with)"
            )
        report = self.evaluator.evaluate(base, 0)
        self.history.append(
            {"kind": "baseline", "deployed_version": 0, "path": base, "step": 0, "report": report.as_dict()}
        )
        log.info("baseline: success %.3f, malformed tool calls %.3f", report.success_rate, report.probe_rate)
        return report, base

    def _gate_unfinished(self) -> None:
        step = self.trainer.step_count
        gated = {int(e.get("step", -1)) for e in self.history.entries() if e["kind"] != "baseline"}
        if step > 0 and step not in gated:
            log.info("candidate %d was checkpointed but not gated before a restart: gating it", step)
            self.trainer.publish_pending()  # a kill between checkpoint and export left no export
            self._gate(step, batch_id=self.trainer.trained_batch_ids[-1])

    def _reset_after_restart(self) -> None:
        """A learner that died after rejecting a candidate but before resetting resets now."""
        entries = self.history.entries()
        last = entries[-1] if entries else {}
        if (
            self.config.reset_on_reject
            and last.get("kind") == "rejected"
            and int(last.get("step", -1)) == self.trainer.step_count
        ):
            self._load_policy(Path(self.incumbent_path))

    def _after_step(self, result: StepResult) -> None:
        if self._num_rollbacks() > self._rollbacks_seen:
            self._follow_rollback(result.step)
            return
        self._gate(result.step, batch_id=result.batch_id)

    def _candidate_path(self, step: int) -> Path:
        export = self.trainer_config.export
        assert export.dir is not None
        return Path(export.dir) / export.model_name / export_dir_name(step)

    def _gate(self, step: int, batch_id: str) -> None:
        path = self._candidate_path(step)
        report = self.evaluator.evaluate(str(path), step)
        decision = self.gate.decide(report, self.incumbent)
        manifest = self.ledger.read(batch_id) or {}
        entry: dict[str, Any] = {
            "step": step,
            "path": str(path.resolve()),
            "batch_id": batch_id,
            "report": report.as_dict(),
            "incumbent": self.incumbent.as_dict(),
            "readiness": manifest.get("readiness"),
            "num_trajectories": len(manifest.get("trajectory_ids", [])),
            "first_feedback_ms": manifest.get("first_feedback_ms", []),
        }
        if not decision.promote:
            self.history.append({"kind": "rejected", "reasons": decision.reasons, **entry})
            log.warning("candidate %d rejected: %s", step, "; ".join(decision.reasons))
            if self.config.reset_on_reject:
                self._load_policy(Path(self.incumbent_path))
            return
        version = self.deployments.deploy(
            str(path.resolve()),
            step=step,
            metadata={
                "step": str(step),
                "success_rate": f"{report.success_rate:.4f}",
                "probe_rate": f"{report.probe_rate:.4f}",
            },
        )
        self.history.append({"kind": "promoted", "deployed_version": version.version, **entry})
        self.incumbent, self.incumbent_path = report, str(path.resolve())
        log.info(
            "candidate %d promoted as version %d: success %.3f, malformed %.3f",
            step,
            version.version,
            report.success_rate,
            report.probe_rate,
        )

    # -- rollbacks -----------------------------------------------------------------------------

    def _num_rollbacks(self) -> int:
        return sum(1 for e in self.history.entries() if e["kind"] == "rollback")

    def _follow_rollback(self, step: int) -> None:
        """Continue training from the rolled-back weights; this step's candidate is dropped."""
        entry = [e for e in self.history.entries() if e["kind"] == "rollback"][-1]
        self._rollbacks_seen = self._num_rollbacks()
        self._load_policy(Path(entry["path"]))
        if entry.get("report"):
            self.incumbent, self.incumbent_path = EvalReport(**entry["report"]), str(entry["path"])
        self.history.append(
            {
                "kind": "rejected",
                "step": step,
                "path": str(self._candidate_path(step)),
                "reasons": [f"superseded by the rollback to {entry['rollback_to']}"],
            }
        )
        log.warning(
            "rollback to version %s seen: training continues from %s", entry["rollback_to"], entry["path"]
        )

    def _load_policy(self, path: Path) -> None:
        """Replace the policy's weights with an exported version's (single-process backend)."""
        from safetensors.torch import load_file

        if self.trainer_config.backend.kind != "single":
            raise ConfigError(
                "oncall: going back to deployed weights (rollback, reset_on_reject) "
                "needs backend.kind: single; set reset_on_reject: false for fsdp2"
            )
        module = self.trainer.models["policy"].module
        assert module is not None
        state = {}
        for file in sorted(path.glob("*.safetensors")):
            state.update(load_file(str(file)))
        getattr(module, "backbone", module).load_state_dict(state, strict=True)  # StacxModel wraps HF
        log.info("policy weights reset to %s", path)


def trained_manifests(state_dir: str | Path) -> list[dict[str, Any]]:
    """Manifests of every batch the latest checkpoint says was trained, in training order."""
    root = Path(state_dir)
    marker = root / "checkpoints" / "latest"
    if not marker.is_file():
        return []
    state = json.loads((root / "checkpoints" / marker.read_text().strip() / "trainer_state.json").read_text())
    return Ledger(root / "ledger").trained(state.get("trained_batch_ids", []))


def audit(state_dir: str | Path) -> dict[str, Any]:
    """What was trained, by id: counts and any id trained twice (there must be none)."""
    manifests = trained_manifests(state_dir)
    out: dict[str, Any] = {"steps": len(manifests)}
    for key in ("trajectory_ids", "interaction_ids", "feedback_ids"):
        ids = [i for m in manifests for i in m[key]]
        out[key] = sorted(set(ids))
        out[f"{key}_twice"] = sorted({i for i in ids if ids.count(i) > 1})
    return out
