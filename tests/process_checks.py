"""Process checks shared by tests that kill or stop processes (they look at /proc, not at the
code under test)."""

from __future__ import annotations

import asyncio
import os
import subprocess
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


def run_to_the_end(
    cmd: list[str], *, cwd: Path, timeout_s: float, what: str
) -> subprocess.CompletedProcess[str]:
    """Run a benchmark that cleans up after itself; past `timeout_s` it gets SIGTERM (it then stops
    what it started) rather than the SIGKILL of `subprocess.run`, which would leave that behind."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=300)
        raise AssertionError(f"{what} ran past {timeout_s} s:\n{stderr[-3000:]}") from None
    except BaseException:  # the suite interrupted (Ctrl-C, its own timeout): the bench stops too
        proc.terminate()
        proc.communicate(timeout=300)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
