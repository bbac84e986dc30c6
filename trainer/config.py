"""Trainer configuration: one typed dataclass per component, loadable from YAML."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from schemas import topics
from trainer.errors import ConfigError
from trainer.models import ModelConfig

__all__ = [
    "BackendConfig",
    "CheckpointConfig",
    "ExportConfig",
    "OptimizerConfig",
    "SourceConfig",
    "TrainerConfig",
    "from_mapping",
    "load_config",
]


def _bootstrap() -> str:
    return topics.default_bootstrap()


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """AdamW with linear warmup."""

    lr: float = 1e-5
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    warmup_steps: int = 0
    """Linear warmup from 0 to `lr` over this many steps."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm (None: no clipping)."""


@dataclass(kw_only=True, slots=True)
class BackendConfig:
    """Where and how the models run."""

    kind: Literal["single", "fsdp2"] = "single"
    """`single` (one process) or `fsdp2` (fully_shard over torch.distributed)."""
    world_size: int = 1
    """Processes to spawn for fsdp2 when not launched by torchrun."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto`: CUDA when available (NCCL), else CPU (gloo)."""
    mixed_precision: bool = False
    """bf16 compute, fp32 reduction (FSDP2 MixedPrecisionPolicy; single process: CUDA autocast)."""

    def __post_init__(self) -> None:
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


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return from_mapping(tp, value, where)
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value, where) if len(args) == 1 else value
    if origin is dict and isinstance(value, dict):
        _, vt = typing.get_args(tp)
        return {k: _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def from_mapping(cls: type[Any], data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from a dict; unknown keys are reported with the valid ones."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown field(s) {unknown}; "
                          f"valid: {sorted(names)}")
    kwargs = {k: _convert(hints[k], v, f"{where}.{k}".lstrip(".")) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from exc


def load_config(path: str | Path) -> TrainerConfig:
    """Read a TrainerConfig from YAML (the whole file, or its `trainer` section)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"trainer config {p} does not exist")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    if isinstance(data.get("trainer"), dict):  # a shared stack file: use its `trainer` section
        data = data["trainer"]
    config: TrainerConfig = from_mapping(TrainerConfig, data)
    return config
