"""The trainer's seams: specializations, batch sources and weight publishers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from stacx.schemas.records import TrainingBatch, WeightVersion
from stacx.trainer.batch import TensorBatch

__all__ = [
    "BatchSource",
    "ModelOutput",
    "Positions",
    "SourcedBatch",
    "Specialization",
    "WeightPublisher",
]

Positions = dict[str, int]
"""Next offset to read per `"topic/partition"`: what a checkpoint stores and a commit writes."""


@dataclass(kw_only=True, slots=True)
class ModelOutput:
    """What one forward pass of a role's model produced (shape legend in trainer/batch.py)."""

    logits: torch.Tensor | None = None
    """[B, L, V] language-model logits (None for value/score models)."""
    values: torch.Tensor | None = None
    """[B, L] scalar head output per position (None for plain LMs)."""
    flow_error: torch.Tensor | None = None
    """[B, K] squared velocity error per sample and (noise, time) draw (flow models, trainer/flow.py)."""


@runtime_checkable
class Specialization(Protocol):
    """What makes one algorithm differ from another, for one role.

    `prepare_batch` runs once on the whole batch before it is split across ranks (model-free:
    e.g. group advantages); `extract_model_output` turns a forward pass into named tensors (the
    outputs data syncs can send to other roles); `compute_loss` is a pure function of those.
    """

    def prepare_batch(self, batch: TensorBatch) -> TensorBatch: ...

    def extract_model_output(self, output: ModelOutput,
                             batch: TensorBatch) -> dict[str, torch.Tensor]: ...

    def compute_loss(self, outputs: dict[str, torch.Tensor],
                     batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]: ...


@dataclass(kw_only=True, slots=True)
class SourcedBatch:
    """A batch plus where it was read from (so its offset can be committed later)."""

    batch: TrainingBatch
    topic: str
    partition: int
    offset: int
    trace_context: Any = None
    """OpenTelemetry context from the event's headers: the training step joins that trace."""
    key: str | None = None
    """The event's Kafka key (kept for its dead letter)."""
    headers: dict[str, bytes] = field(default_factory=dict)
    """The event's Kafka headers (kept for its dead letter)."""

    @property
    def position_key(self) -> str:
        return f"{self.topic}/{self.partition}"


class BatchSource(Protocol):
    """Where TrainingBatches come from: memory (tests), a Kafka topic, or a replayed topic."""

    def poll(self, timeout_s: float) -> SourcedBatch | None:
        """The next batch, or None when none arrived within `timeout_s`."""
        ...

    def commit(self, positions: Positions) -> None:
        """Durably record that everything before `positions` is trained and checkpointed."""
        ...

    def seek(self, positions: Positions) -> None:
        """Resume reading at `positions` (from a checkpoint)."""
        ...

    def reject(self, sourced: SourcedBatch, error: Exception) -> None:
        """Set aside a batch the trainer cannot use (a dead letter with `error` as its reason and
        the event's headers); the trainer then moves past it."""
        ...

    @property
    def exhausted(self) -> bool:
        """True when the trainer should stop: no more batches (memory) or idle too long."""
        ...

    def close(self) -> None: ...


class WeightPublisher(Protocol):
    """Announces exported weights (a `WeightVersion` event on `stacx.weights`)."""

    def publish(self, version: WeightVersion) -> None: ...

    def close(self) -> None: ...
