"""Trainer configuration: one typed dataclass per component, read by the one config loader."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from stacx.schemas import topics
from stacx.trainer.errors import ConfigError
from stacx.trainer.model_config import ModelConfig

__all__ = [
    "BackendConfig",
    "CheckpointConfig",
    "ExportConfig",
    "OptimizerConfig",
    "SourceConfig",
    "TrainerConfig",
    "load_config",
]


def _bootstrap() -> str:
    return topics.default_bootstrap()


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """AdamW with linear warmup."""

    lr: PositiveFloat = 1e-5
    """Peak learning rate."""
    weight_decay: NonNegativeFloat = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: PositiveFloat = 1e-8
    """Adam epsilon."""
    warmup_steps: NonNegativeInt = 0
    """Linear warmup from 0 to `lr` over this many steps."""
    max_grad_norm: PositiveFloat | None = 1.0
    """Clip the global gradient norm (None: no clipping)."""


@dataclass(kw_only=True, slots=True)
class BackendConfig:
    """Where and how the models run."""

    kind: Literal["single", "fsdp2"] = "single"
    """`single` (one process) or `fsdp2` (fully_shard over torch.distributed)."""
    world_size: PositiveInt = 1
    """Processes to spawn for fsdp2 when not launched by torchrun."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto`: CUDA when available (NCCL), else CPU (gloo)."""
    mixed_precision: bool = False
    """bf16 compute, fp32 reduction (FSDP2 MixedPrecisionPolicy; single process: CUDA autocast)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass (Hugging Face gradient
    checkpointing, non-reentrant): less activation memory for about a third more compute."""
    cpu_offload: bool = False
    """fsdp2: parameters, gradients and optimizer state live in CPU memory between uses
    (FSDP2 CPUOffloadPolicy; the optimizer step runs on the CPU): a bigger model per GPU."""
    process_group_timeout_s: float = 120.0
    """fsdp2: how long a collective waits for a silent peer (a lost host, a link down) before the
    rank fails, so the launch restarts from the checkpoint (torch's default is 30 minutes)."""

    def __post_init__(self) -> None:
        if self.process_group_timeout_s <= 0:
            raise ConfigError(
                f"backend.process_group_timeout_s={self.process_group_timeout_s}: use > 0 seconds"
            )
        if self.cpu_offload and self.kind != "fsdp2":
            raise ConfigError("backend.cpu_offload needs backend.kind: fsdp2 (FSDP2's CPU offload)")
        if self.world_size < 1:
            raise ConfigError(f"backend.world_size={self.world_size}: must be >= 1")
        if self.kind == "single" and self.world_size != 1:
            raise ConfigError("backend.world_size > 1 needs backend.kind: fsdp2")


@dataclass(kw_only=True, slots=True)
class SourceConfig:
    """Where TrainingBatches are read from."""

    kind: Literal["kafka", "memory"] = "kafka"
    """`kafka` (live or replayed topic) or `memory` (pass a source to StacxTrainer)."""
    bootstrap_servers: str = field(default_factory=_bootstrap)
    """Kafka bootstrap servers."""
    topic: str = topics.BATCHES
    """Topic of TrainingBatch events."""
    group_id: str = "stacx-trainer"
    """Consumer group: committed offsets are the trainer's progress."""
    replay_from_offset: int | None = None
    """Replay: start every partition at this offset (ignores committed offsets)."""
    replay_from_timestamp_ms: int | None = None
    """Replay: start at the first event at or after this time."""
    poll_timeout_s: float = 1.0
    """How long one poll waits."""
    idle_timeout_s: float | None = None
    """Stop when no batch arrived for this long once partitions are assigned (None: never)."""
    session_timeout_ms: int = 10_000
    """Consumer session timeout: how soon a crashed trainer's partitions are reassigned, so a
    restarted trainer reads again within about this time (heartbeats run in the background,
    a long step does not count against it)."""
    max_poll_interval_ms: int = 300_000
    """The longest gap between two reads before the group evicts the trainer (a step longer
    than this costs a rejoin and one refused commit, which the next checkpoint makes good)."""
    dlq_topic: str | None = topics.DLQ
    """Where batches the trainer cannot use go, with the reason (None: only logged)."""


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """torch.distributed.checkpoint snapshots; offsets are committed only after one is written."""

    dir: str | None = None
    """Checkpoint root (None: no checkpoints, offsets are never committed)."""
    every_steps: int = 1
    """Checkpoint (then commit offsets) every this many steps."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    resume: bool = True
    """Resume from the latest checkpoint in `dir` when there is one."""


@dataclass(kw_only=True, slots=True)
class ExportConfig:
    """HF-layout safetensors export and WeightVersion announcements."""

    dir: str | None = None
    """Export root (None: no export)."""
    every_steps: int = 1
    """Export and publish every this many steps."""
    model_name: str = "policy"
    """Name in the WeightVersion (the Kafka key on stacx.weights)."""
    publish: bool = True
    """Publish a WeightVersion after each export."""
    topic: str = topics.WEIGHTS
    """Topic of WeightVersion events."""
    bootstrap_servers: str = field(default_factory=_bootstrap)
    """Kafka bootstrap servers for the publisher."""
    keep_last: int | None = 3
    """Exported versions to keep on disk (None: all)."""


@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    """Everything `stacx train CONFIG` needs."""

    recipe: str = "grpo"
    """Registered recipe name (`stacx recipes`)."""
    models: dict[str, ModelConfig]
    """Weights per init key: `policy` always; `teacher` for opd; others default to `policy`."""
    role_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Overrides of specialization hyperparameters per role, e.g. {policy: {kl_beta: 0.0}}."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    max_steps: int | None = None
    """Stop after this many optimizer steps in total (None: run until the source is idle)."""
    seed: int = 0
    """Seed of torch/numpy/python RNGs."""
    trainer_id: str = "stacx-trainer"
    """Written into WeightVersion events."""

    def __post_init__(self) -> None:
        if "policy" not in self.models:
            raise ConfigError("models.policy is required (a `path` or `tiny` model)")


def load_config(path: str | Path) -> TrainerConfig:
    """A TrainerConfig from YAML (the whole file, or its `trainer` section), through the one
    config loader (`stacx.schemas.config`): every problem is one line with its field path."""
    from stacx.schemas.config import ConfigError as FileError
    from stacx.schemas.config import build, file_section, load_yaml

    try:
        data, where = file_section(load_yaml(path), "trainer", TrainerConfig, str(path))
        return build(TrainerConfig, data, where=where)
    except FileError as exc:
        raise ConfigError(exc.lines) from exc
