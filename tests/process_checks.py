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
