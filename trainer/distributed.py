"""Process groups: joining the env:// group (spawned local ranks or a torchrun launch) and placing
worker groups on ranks. Spawning the ranks is `stacx.trainer.ranks` (no torch there), re-exported here."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from stacx.trainer.ranks import free_port, spawn

__all__ = ["free_port", "init_process_group", "place_groups", "spawn"]

def init_process_group(
    use_cuda: bool, world_size: int = 1, timeout_s: float = 120.0
) -> tuple[int, int]:
    """Join the env:// process group (NCCL on GPU, gloo on CPU); returns (rank, world_size).
    Outside torchrun/spawn a `world_size` of 1 is a group of this process alone (an in-memory
    store: nothing listens), so one rank trains in the calling process. A collective that waits
    longer than `timeout_s` for a peer fails (a silent peer: a lost host, a link down)."""
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            if world_size != 1:
                raise RuntimeError(f"backend.kind=fsdp2 with world_size={world_size} outside torchrun/"
                                   "spawn: no RANK in the environment (StacxTrainer.launch spawns "
                                   "the ranks for you)")
            dist.init_process_group("nccl" if use_cuda else "gloo", store=dist.HashStore(), rank=0,
                                    world_size=1, timeout=timeout)
            return 0, 1
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def place_groups(groups: dict[str, int], world_size: int) -> dict[str, list[int]]:
    """Ranks of each worker group; fixed sizes first served in order, 0 = share the rest.

    With too few ranks every group gets all ranks (colocated).
    """
    fixed = sum(n for n in groups.values() if n > 0)
    flexible = [g for g, n in groups.items() if n == 0]
    everything = list(range(world_size))
    if world_size == 1 or fixed + len(flexible) > world_size or (not flexible and fixed != world_size):
        return {g: everything for g in groups}
    share, extra = divmod(world_size - fixed, max(1, len(flexible)))
    placement, start = {}, 0
    for name, n in groups.items():
        size = n if n > 0 else share + (1 if flexible.index(name) < extra else 0)
        placement[name] = everything[start:start + size]
        start += size
    return placement
