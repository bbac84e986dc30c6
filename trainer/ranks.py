"""Local ranks started without torch: the launcher only spawns them, waits and stops them.

`spawn` starts `world_size` fresh interpreters (the stdlib's "spawn" start method) that form one
env:// process group on 127.0.0.1 and a free port. The rank function may be named by a
`package.module:function` string, resolved inside each rank, so the launcher imports neither
torch nor the trainer's engine (`spawn_trainer` runs the trainer that way).

A config problem a rank finds (a `ConfigError` or `RecipeError`, e.g. an unknown recipe) is sent
back to the launcher, which raises it as one error; any other failure of a rank is a `RankError`
naming the rank and how it ended. Either way the other ranks are stopped first.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from stacx.schemas.config import ConfigError as FileConfigError
from stacx.schemas.plugins import import_object
from stacx.trainer.errors import ConfigError, RankError, RecipeError, TrainerError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import SimpleQueue

    from stacx.trainer.config import BackendConfig, TrainerConfig

__all__ = ["TRAINER_RANK", "free_port", "spawn", "spawn_trainer", "spawns_ranks"]

TRAINER_RANK = "stacx.trainer.engine:run_rank"
"""The rank function of `spawn_trainer`: `run_rank(config, max_steps, rank_setup)`."""

_PR_SET_PDEATHSIG = 1
"""prctl option: the signal a process gets when its parent dies (linux/prctl.h)."""

_CONFIG_EXIT = 2
"""Exit status of a rank that reported a config problem to the launcher."""

Report = tuple[int, str, str]
"""(rank, "config" or "recipe", message) of a config problem found in a rank."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawns_ranks(backend: BackendConfig) -> bool:
    """Whether the trainer spawns local ranks: fsdp2 on world_size > 1, not launched by torchrun."""
    return backend.kind == "fsdp2" and backend.world_size > 1 and "RANK" not in os.environ


def spawn_trainer(config: TrainerConfig, max_steps: int | None = None,
                  rank_setup: Callable[[], object] | None = None) -> None:
    """Train on `config.backend.world_size` spawned local ranks; `rank_setup` (picklable) runs
    first in each rank. This process never imports torch."""
    spawn(TRAINER_RANK, config.backend.world_size, config, max_steps, rank_setup)


def spawn(fn: str | Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run `fn(*args)` in `world_size` fresh processes forming one process group (env://); `fn`
    is picklable or named `package.module:function`. If the launcher is interrupted (Ctrl-C,
    SIGTERM), the ranks are stopped before it returns."""
    context = multiprocessing.get_context("spawn")
    reports: SimpleQueue[Report] = context.SimpleQueue()
    rank_args = (fn, world_size, free_port(), args, logging.getLogger().getEffectiveLevel(), reports)
    processes = [context.Process(target=_entry, args=(rank, *rank_args), name=f"rank{rank}")
                 for rank in range(world_size)]
    try:
        for process in processes:
            process.start()
        failed = _first_failure(processes)
    except BaseException:
        _stop_ranks(processes)
        raise
    if failed is not None:
        _stop_ranks(processes)
        raise _failure(*failed, reports) from None


def _entry(rank: int, fn: str | Callable[..., Any], world_size: int, port: int, args: tuple,
           log_level: int, reports: SimpleQueue[Report]) -> None:
    _die_with_parent()
    faulthandler.enable()  # a fatal signal (a library's abort) prints where each thread was
    atexit.register(_end_finished_rank)  # runs after the handlers registered later (tracing's flush)
    logging.basicConfig(level=log_level,
                        format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
    _share_cpus(world_size)
    target = import_object(fn) if isinstance(fn, str) else fn
    try:
        target(*args)
        _rank_state["finished"] = True
    except KeyboardInterrupt:  # Ctrl-C reaches every rank of the terminal's process group
        raise SystemExit(128 + signal.SIGINT) from None
    except RecipeError as exc:  # the user's to fix: one line at the launcher, no traceback
        reports.put((rank, "recipe", str(exc)))
        raise SystemExit(_CONFIG_EXIT) from None
    except FileConfigError as exc:
        reports.put((rank, "config", str(exc)))
        raise SystemExit(_CONFIG_EXIT) from None


_rank_state = {"finished": False}
"""Whether this rank's function returned (set in the rank's process only)."""


def _end_finished_rank() -> None:
    """A rank whose function returned ends here, after the exit handlers registered after
    `_entry`'s (the tracing set-up's span flush), its logs and output flushed, and before the
    interpreter's teardown. There the native objects libraries still hold (gloo work of the last
    FSDP2 collective and its threads) are destroyed after the process group is gone. A clean
    two-rank run once lost a rank to SIGABRT after its last job had started ("terminate called
    without an active exception": a C++ thread destroyed while joinable), which that teardown
    explains; the `faulthandler` of `_entry` prints the Python stacks of any such abort that
    remains. A rank that failed exits the normal way, with its status."""
    if not _rank_state["finished"]:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def _share_cpus(world_size: int) -> None:
    import torch  # in the rank only: the launcher holds no tensor

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))


def _die_with_parent() -> None:
    """A rank never outlives the launcher (killed with -9 too): the kernel sends it SIGKILL."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _first_failure(processes: Sequence[BaseProcess]) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank to end other than with 0; None when all did."""
    running = dict(enumerate(processes))
    while running:
        wait([process.sentinel for process in running.values()])
        for rank, process in list(running.items()):
            code = process.exitcode
            if code is None:
                continue
            del running[rank]
            if code != 0:
                return rank, code
    return None


def _failure(rank: int, code: int, reports: SimpleQueue[Report]) -> TrainerError:
    if not reports.empty():  # a rank found a config problem (it wrote it before exiting)
        _, kind, message = reports.get()
        return RecipeError(message) if kind == "recipe" else ConfigError(message.splitlines())
    if code < 0:
        try:
            how = f"signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"signal {-code}"
    else:
        how = f"exit code {code}"
    return RankError(f"process {rank} terminated with {how}; the other ranks were stopped")


def _stop_ranks(processes: Sequence[BaseProcess], grace_s: float = 10.0) -> None:
    started = [process for process in processes if process.pid is not None]
    for process in started:
        if process.is_alive():
            process.terminate()
    for process in started:
        process.join(grace_s)
        if process.is_alive():
            process.kill()
            process.join(5)
