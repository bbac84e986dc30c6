"""What every backend provides: model placement, collectives and full (gathered) state dicts."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from stacx.trainer.config import BackendConfig

__all__ = ["Backend"]


class Backend:
    """Single-process semantics; FSDP2Backend overrides placement and the collectives."""

    name = "single"

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        use_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
        self.use_cuda = use_cuda
        self.rank, self.world_size = 0, 1
        self.device = torch.device("cuda" if use_cuda else "cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def prepare_model(self, model: nn.Module | None, ranks: list[int]) -> nn.Module | None:
        """Move (and shard) a model for the ranks that host it; every rank calls it, in order.

        `model` is None on ranks outside `ranks` (they only join the collective setup).
        """
        return None if model is None else checkpointed(model, self.config).to(self.device)

    def autocast(self) -> Any:
        """Context for forward passes (bf16 autocast on GPU when mixed precision is asked)."""
        import contextlib

        if self.config.mixed_precision and self.use_cuda and self.name == "single":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def barrier(self) -> None:
        pass

    def broadcast_object(self, obj: Any, src: int) -> Any:
        return obj

    def all_reduce_sum(self, tensor: torch.Tensor, ranks: list[int] | None = None) -> torch.Tensor:
        """`tensor` summed over `ranks` (None: every rank); only those ranks call it."""
        return tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (collective over all ranks)."""
        return [obj]

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Unsharded CPU copy of a module's weights (collective over the module's ranks)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}

    def close(self, *, graceful: bool = True) -> None:
        """Release the backend; `graceful=False` (interrupted, failed) runs no collective."""


def checkpointed(model: nn.Module, config: Any) -> nn.Module:
    """`model` with activation checkpointing on when `config.activation_checkpointing`: the
    Hugging Face model in it (`gradient_checkpointing_enable`, non-reentrant) recomputes each
    decoder layer's activations in the backward pass."""
    if not getattr(config, "activation_checkpointing", False):
        return model
    for module in model.modules():
        enable = getattr(module, "gradient_checkpointing_enable", None)
        if callable(enable):
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return model
    raise ValueError(f"backend.activation_checkpointing: {type(model).__name__} holds no Hugging Face "
                     "model (no gradient_checkpointing_enable()); turn it off for this model")
