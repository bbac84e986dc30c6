"""Process groups: spawning local ranks (127.0.0.1, a free port) or joining a torchrun launch."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from trainer.errors import RankError

__all__ = ["free_port", "init_process_group", "place_groups", "spawn"]

_PR_SET_PDEATHSIG = 1
"""prctl option: the signal a process gets when its parent dies (linux/prctl.h)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple,
           log_level: int) -> None:
    _die_with_parent()
    logging.basicConfig(level=log_level,
                        format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        fn(*args)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank of the terminal's process group
        raise SystemExit(128 + signal.SIGINT) from None


def _die_with_parent() -> None:
    """A rank never outlives the launcher (killed with -9 too): the kernel sends it SIGKILL."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def spawn(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run `fn(*args)` in `world_size` fresh processes forming one process group (env://).
    If the launcher is interrupted (Ctrl-C, SIGTERM), the ranks are stopped before it returns."""
    import torch.multiprocessing as mp

    level = logging.getLogger().getEffectiveLevel()
    context = mp.start_processes(_entry, args=(fn, world_size, free_port(), args, level),
                                 nprocs=world_size, join=False, start_method="spawn")
    try:
        while not context.join(timeout=1.0):
            pass
    except mp.ProcessExitedException as exc:  # a rank killed, or ended by an error it logged
        _stop_ranks(context.processes)
        raise RankError(f"{exc}; the other ranks were stopped") from None
    except BaseException:
        _stop_ranks(context.processes)
        raise


def _stop_ranks(processes: list[Any], grace_s: float = 10.0) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(grace_s)
        if process.is_alive():
            process.kill()
            process.join(5)


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
