"""Process checks shared by tests that kill or stop processes (they look at /proc, not at the
code under test)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Running (a zombie left for init to reap counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def gone(pid: int) -> bool:
    """The process has ended (a kill is delivered asynchronously: allow it a few seconds)."""
    for _ in range(200):
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def run_processes(run_prefix: str) -> list[int]:
    """Live processes of the pipeline runs whose id starts with `run_prefix` (the pipeline sets
    STACX_RUN_ID on every process it starts)."""
    needle = f"STACX_RUN_ID={run_prefix}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(v.startswith(needle) for v in env) and alive(int(proc.name)):
            found.append(int(proc.name))
    return found
