"""A silent peer (a lost host, a link down: no error, no closed socket) fails a collective within
`backend.process_group_timeout_s`, not after torch's 30-minute default, so the launch restarts
from the checkpoint instead of hanging."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from stacx.trainer.config import BackendConfig
from stacx.trainer.ranks import free_port

TIMEOUT_S = 3.0


def _rank(rank: int, port: int, results: mp.Queue) -> None:  # type: ignore[type-arg]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    import torch
    import torch.distributed as dist

    from stacx.trainer.distributed import init_process_group

    init_process_group(False, 2, TIMEOUT_S)
    dist.all_reduce(torch.ones(1))  # both ranks answer once
    if rank == 1:
        time.sleep(120)  # then this one goes silent: alive, its sockets open, never answering
        return
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
        results.put(("finished", time.monotonic() - started))
    except Exception as exc:  # gloo's timeout: RuntimeError / DistBackendError
        results.put((type(exc).__name__, time.monotonic() - started))


def test_a_silent_peer_fails_the_collective_within_the_timeout() -> None:
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    port = free_port()
    ranks = [ctx.Process(target=_rank, args=(rank, port, results), daemon=True) for rank in (0, 1)]
    for proc in ranks:
        proc.start()
    try:
        outcome, waited_s = results.get(timeout=90)
    finally:
        for proc in ranks:
            proc.kill()
            proc.join(10)
    assert outcome != "finished"
    assert TIMEOUT_S * 0.8 <= waited_s < TIMEOUT_S + 15


def test_the_timeout_is_validated() -> None:
    import pytest

    from stacx.trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="process_group_timeout_s"):
        BackendConfig(process_group_timeout_s=0)
    assert BackendConfig().process_group_timeout_s == 120.0
