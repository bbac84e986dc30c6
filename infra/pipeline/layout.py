"""Where a run writes (`runs/<name>/...`), which topics it uses, and the config file of every
service, filled in from the pipeline spec. Pure functions: unit-tested without services."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.pipeline.config import PipelineSpec
from schemas import topics

__all__ = [
    "RunLayout",
    "RunTopics",
    "assembler_section",
    "rollout_section",
    "trainer_section",
]


@dataclass(kw_only=True, slots=True)
class RunTopics:
    """The topics one run reads and writes."""

    trajectories: str
    batches: str
    weights: str
    tasks: str
    """The run's training tasks (always its own topic: the rollout service resumes from its
    consumer group's committed offsets after a restart)."""

    @classmethod
    def for_run(cls, run_id: str, *, fresh: bool) -> RunTopics:
        """`stacx.<kind>.<run_id>` when fresh (nothing left over from other runs), else the
        standard topics of schemas/topics.py."""
        tasks = f"{topics.TASKS}.{run_id}"
        if not fresh:
            return cls(
                trajectories=topics.TRAJECTORIES, batches=topics.BATCHES, weights=topics.WEIGHTS, tasks=tasks
            )
        return cls(
            trajectories=f"{topics.TRAJECTORIES}.{run_id}",
            batches=f"{topics.BATCHES}.{run_id}",
            weights=f"{topics.WEIGHTS}.{run_id}",
            tasks=tasks,
        )

    def specs(self) -> tuple[topics.TopicSpec, ...]:
        """The standard topics' specs (partitions, configs) under this run's names.

        The broker stores them gzip-compressed whatever the producer used: the Faust assembler
        (aiokafka) decodes gzip with the standard library, but lz4 (EventProducer's default)
        only with the optional `cramjam` package, which is not installed.
        """
        base = {t.name: t for t in topics.TOPICS}
        return tuple(
            topics.TopicSpec(name, base[std].partitions, {**base[std].config, "compression.type": "gzip"})
            for name, std in (
                (self.trajectories, topics.TRAJECTORIES),
                (self.batches, topics.BATCHES),
                (self.weights, topics.WEIGHTS),
                (self.tasks, topics.TASKS),
            )
        )


@dataclass(kw_only=True, slots=True)
class RunLayout:
    """Paths and names of one run."""

    name: str
    run_id: str
    root: Path
    topics: RunTopics
    model_name: str
    """Kafka key of the policy on the weights topic."""

    @classmethod
    def create(cls, spec: PipelineSpec, *, now: float | None = None) -> RunLayout:
        cfg = spec.pipeline
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
        run_id = f"{cfg.name}-{stamp}"
        return cls(
            name=cfg.name,
            run_id=run_id,
            root=Path(cfg.runs_dir) / cfg.name,
            topics=RunTopics.for_run(run_id, fresh=cfg.fresh_topics),
            model_name="policy" if cfg.fresh_topics else run_id,
        )

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def base_model(self) -> Path:
        return self.root / "models" / "base"

    @property
    def sft_root(self) -> Path:
        return self.root / "models"

    @property
    def weights_dir(self) -> Path:
        return self.root / "weights"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def train_tasks(self) -> Path:
        return self.root / "tasks" / "train.jsonl"

    @property
    def heldout_tasks(self) -> Path:
        return self.root / "tasks" / "heldout.jsonl"

    @property
    def report_path(self) -> Path:
        return self.root / "report.json"

    @property
    def curve_path(self) -> Path:
        return self.root / "reward_curve.png"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def rollout_section(
    spec: PipelineSpec, layout: RunLayout, *, model_dir: Path, inference_url: str, gateway_url: str
) -> dict[str, Any]:
    """`stacx rollout` config: the spec's `rollout` section plus this run's data and endpoints."""
    return _merge(
        spec.rollout,
        {
            # tasks through a consumer group: a restarted rollout service goes on where it stopped
            "data": {
                "path": None,
                "topic": layout.topics.tasks,
                "consumer_group": f"stacx-rollout-{layout.run_id}",
            },
            "inference": {"url": inference_url, "tokenizer": str(model_dir.resolve())},
            "sandbox": {"url": gateway_url},
            "kafka": {
                "bootstrap_servers": spec.bootstrap_servers,
                "publish": True,
                "follow_weights": True,
                "trajectories_topic": layout.topics.trajectories,
                "weights_topic": layout.topics.weights,
            },
            "manager": {"model_name": layout.model_name},
            "progress": False,
        },
    )


def assembler_section(spec: PipelineSpec, layout: RunLayout) -> dict[str, Any]:
    """`stacx assemble --config` file contents (an `assembler:` section)."""
    section = _merge(
        spec.assembler,
        {
            "app_id": f"stacx-assembler-{layout.run_id}",
            "bootstrap_servers": spec.bootstrap_servers,
            "trajectories_topic": layout.topics.trajectories,
            "batches_topic": layout.topics.batches,
            "weights_topic": layout.topics.weights,
            "datadir": str((layout.root / "assembler").resolve()),
        },
    )
    return {"assembler": section}


def trainer_section(spec: PipelineSpec, layout: RunLayout, *, model_dir: Path) -> dict[str, Any]:
    """`stacx train` config (TrainerConfig) for the GRPO loop of this run."""
    return _merge(
        spec.trainer,
        {
            "models": {"policy": {"path": str(model_dir.resolve())}},
            "source": {
                "bootstrap_servers": spec.bootstrap_servers,
                "topic": layout.topics.batches,
                "group_id": f"stacx-trainer-{layout.run_id}",
            },
            "export": {
                "dir": str(layout.weights_dir.resolve()),
                "model_name": layout.model_name,
                "publish": True,
                "topic": layout.topics.weights,
                "bootstrap_servers": spec.bootstrap_servers,
            },
            # resume stays on (TrainerConfig's default): a restarted trainer goes on from its
            # last checkpoint, so nothing is trained twice or left out
            "checkpoint": {"dir": str(layout.checkpoints_dir.resolve())},
            "max_steps": spec.pipeline.steps,
            "trainer_id": f"stacx-trainer-{layout.run_id}",
        },
    )
