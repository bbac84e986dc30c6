"""Process groups: spawning local ranks (127.0.0.1, a free port) or joining a torchrun launch."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["free_port", "init_process_group", "place_groups", "spawn"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple,
           log_level: int) -> None:
    logging.basicConfig(level=log_level,
                        format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    fn(*args)


def spawn(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run `fn(*args)` in `world_size` fresh processes forming one process group (env://)."""
    import torch.multiprocessing as mp

    level = logging.getLogger().getEffectiveLevel()
    mp.spawn(_entry, args=(fn, world_size, free_port(), args, level), nprocs=world_size, join=True)


def init_process_group(use_cuda: bool) -> tuple[int, int]:
    """Join the env:// process group (NCCL on GPU, gloo on CPU); returns (rank, world_size)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise RuntimeError("backend.kind=fsdp2 outside torchrun/spawn: no RANK in the "
                               "environment (StacxTrainer.launch spawns the ranks for you)")
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if use_cuda else "gloo")
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
