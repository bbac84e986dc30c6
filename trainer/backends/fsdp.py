"""FSDP2 (`fully_shard`) over torch.distributed: gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stacx.trainer.backends.base import Backend, checkpointed
from stacx.trainer.config import BackendConfig
from stacx.trainer.distributed import init_process_group

__all__ = ["FSDP2Backend"]

log = logging.getLogger(__name__)


class FSDP2Backend(Backend):
    """Each model is sharded over the mesh of its worker group; every decoder layer is a unit."""

    name = "fsdp2"

    def __init__(self, config: BackendConfig) -> None:
        Backend.__init__(self, config)
        self._owns_group = not dist.is_initialized()
        self.rank, self.world_size = init_process_group(
            self.use_cuda, config.world_size, config.process_group_timeout_s
        )
        if self.use_cuda:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._meshes: dict[tuple[int, ...], Any] = {}

    def mesh(self, ranks: list[int]) -> Any:
        """Device mesh of `ranks` (created collectively: every rank must ask in the same order)."""
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

        key = tuple(ranks)
        if key not in self._meshes:
            kind = "cuda" if self.use_cuda else "cpu"
            self._meshes[key] = (init_device_mesh(kind, (self.world_size,))
                                 if len(ranks) == self.world_size
                                 else DeviceMesh(kind, torch.tensor(ranks)))
        return self._meshes[key]

    def _mp_policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not self.config.mixed_precision:
            return MixedPrecisionPolicy()
        if not self.use_cuda:
            log.warning("backend.mixed_precision on CPU: bf16 compute with fp32 reduction")
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def prepare_model(self, model: nn.Module | None, ranks: list[int]) -> nn.Module | None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.mesh(ranks)
        if model is None or self.rank not in ranks:
            return None
        model = checkpointed(model, self.config).to(self.device)
        options = {"mesh": mesh, "mp_policy": self._mp_policy(), **self._offload()}
        for module in model.modules():
            if type(module).__name__.endswith("DecoderLayer"):
                fully_shard(module, **options)
        fully_shard(model, **options)
        return model

    def _offload(self) -> dict[str, Any]:
        """FSDP2's CPU offload policy when `backend.cpu_offload` (parameters live on the CPU)."""
        if not self.config.cpu_offload:
            return {}
        from torch.distributed.fsdp import CPUOffloadPolicy

        # pinned host memory (fast copies to the GPU) needs CUDA; on CPU the copies are no-ops
        return {"offload_policy": CPUOffloadPolicy(pin_memory=self.use_cuda)}

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_object(self, obj: Any, src: int) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_reduce_sum(self, tensor: torch.Tensor, ranks: list[int] | None = None) -> torch.Tensor:
        out = tensor.to(self.device if self.use_cuda else "cpu").clone()
        group = None if ranks is None or len(ranks) == self.world_size \
            else self.mesh(ranks).get_group()
        dist.all_reduce(out, group=group)
        return out.to(tensor.device)

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state: dict[str, torch.Tensor] = get_model_state_dict(module, options=options)  # type: ignore[assignment]
        return state

    def close(self, *, graceful: bool = True) -> None:
        """Leave the process group if this backend created it. After an interrupt or a failure
        (`graceful=False`) no collective runs: a rank waiting in another collective, or already
        dead, would never meet it, and this process would hang instead of exiting."""
        if not dist.is_initialized():
            return
        if not graceful:
            log.info("leaving the process group without a barrier (interrupted run)")
            return
        dist.barrier()
        if self._owns_group:
            dist.destroy_process_group()
