"""Model workers (one per model slot on this rank) and role workers (one per recipe role)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stacx.trainer.batch import TensorBatch
from stacx.trainer.config import OptimizerConfig
from stacx.trainer.errors import RecipeError
from stacx.trainer.losses import entropy_metrics
from stacx.trainer.protocols import ModelOutput, Specialization
from stacx.trainer.recipe import ModelSlot, Role

__all__ = ["ModelWorker", "RoleWorker", "build_optimizer"]


def build_optimizer(module: nn.Module, config: OptimizerConfig) -> tuple[Any, Any]:
    """AdamW plus a linear-warmup LambdaLR."""
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                                  weight_decay=config.weight_decay)
    warmup = config.warmup_steps

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass(kw_only=True, slots=True)
class ModelWorker:
    """One model slot placed on `ranks`; on other ranks `module` is None."""

    slot: ModelSlot
    ranks: list[int]
    module: nn.Module | None
    optimizer: Any = None
    scheduler: Any = None
    _cached_ids: torch.Tensor | None = None
    _cached_output: ModelOutput | None = None

    @property
    def trainable(self) -> bool:
        return self.slot.trainable

    def forward(self, batch: TensorBatch) -> ModelOutput:
        """One forward per batch and step: roles sharing this model share it (and its graph)."""
        if self._cached_ids is batch.input_ids and self._cached_output is not None:
            return self._cached_output
        assert self.module is not None, f"slot {self.slot.name} is not placed on this rank"
        with torch.set_grad_enabled(self.trainable):
            output = self.module(batch.input_ids, batch.attention_mask)
        self._cached_ids, self._cached_output = batch.input_ids, output
        return output

    def reset(self) -> None:
        self._cached_ids = self._cached_output = None


@dataclass(kw_only=True, slots=True)
class RoleWorker:
    """A recipe role bound to its model workers."""

    role: Role
    workers: list[ModelWorker]
    full_batch: bool = False
    """Compute on the whole batch (its outputs are broadcast to another worker group)."""
    group: str = field(init=False)

    def __post_init__(self) -> None:
        groups = {w.slot.group for w in self.workers}
        trainable = {w.trainable for w in self.workers}
        if len(groups) != 1 or len(trainable) != 1:
            raise RecipeError(f"role {self.role.name!r}: its models must share one worker group "
                              "and be all trainable or all frozen")
        self.group = groups.pop()

    @property
    def specialization(self) -> Specialization:
        return self.role.specialization

    @property
    def trainable(self) -> bool:
        return self.workers[0].trainable

    @property
    def ranks(self) -> list[int]:
        return self.workers[0].ranks

    def with_options(self, options: dict[str, Any]) -> None:
        """Override specialization hyperparameters (`TrainerConfig.role_options[role]`)."""
        try:
            spec: Any = self.role.specialization
            self.role.specialization = dataclasses.replace(spec, **options)
        except (TypeError, RecipeError) as exc:
            raise RecipeError(f"role_options.{self.role.name}: {exc}") from exc

    def run(self, batch: TensorBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None,
                                               dict[str, float]]:
        """(outputs averaged over the role's models, summed loss or None, metrics)."""
        spec = self.specialization
        forwards = [w.forward(batch) for w in self.workers]
        per_model = [spec.extract_model_output(output, batch) for output in forwards]
        outputs = per_model[0] if len(per_model) == 1 else {
            k: torch.stack([o[k] for o in per_model]).mean(0) for k in per_model[0]}
        if not self.trainable:
            return outputs, None, {}
        loss: torch.Tensor | None = None
        metrics: dict[str, float] = {}
        for out in per_model:
            part, part_metrics = spec.compute_loss(out, batch)
            loss = part if loss is None else loss + part
            metrics = metrics or part_metrics
        logits = forwards[0].logits
        if logits is not None and logits.shape[1] == batch.loss_mask.shape[1] + 1:
            metrics = {**metrics, **entropy_metrics(logits[:, :-1], batch.loss_mask, batch.temperatures)}
        return outputs, loss, metrics
