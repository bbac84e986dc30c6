"""Memory per service of a run: resident memory of each service's process tree (psutil) and the
GPU memory its processes hold (`nvidia-smi`, where there is one), as `memory/<service>/*_gb`."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Mapping

import psutil

__all__ = ["gpu_memory_by_pid", "parse_compute_apps", "service_memory"]

log = logging.getLogger(__name__)

GB = 1024**3
MIB = 1024**2
QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
"""nvidia-smi's per-process GPU memory, in MiB."""


def service_memory(pids: Mapping[str, int]) -> dict[str, float]:
    """`memory/<service>/rss_gb` per service (its process and all its children), and
    `memory/<service>/gpu_gb` for a service whose processes hold GPU memory."""
    gpu = gpu_memory_by_pid()
    figures: dict[str, float] = {}
    for name, pid in pids.items():
        tree = _tree(pid)
        if not tree:
            continue
        figures[f"memory/{name}/rss_gb"] = sum(_rss(p) for p in tree) / GB
        held = sum(gpu.get(p.pid, 0) for p in tree)
        if held:
            figures[f"memory/{name}/gpu_gb"] = held / GB
    return figures


def _tree(pid: int) -> list[psutil.Process]:
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.Error:  # the service is restarting or gone: no figure this time
        return []


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


def gpu_memory_by_pid() -> dict[int, int]:
    """Bytes of GPU memory per process id (empty without `nvidia-smi`)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return {}
    try:
        done = subprocess.run([tool, *QUERY], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("tracking: nvidia-smi: %s", exc)
        return {}
    return parse_compute_apps(done.stdout)


def parse_compute_apps(text: str) -> dict[int, int]:
    """`pid, MiB` lines (several GPUs: one line each) to bytes per pid."""
    held: dict[int, int] = {}
    for line in text.splitlines():
        pid, _, mib = (part.strip() for part in line.partition(","))
        if pid.isdigit() and mib.isdigit():
            held[int(pid)] = held.get(int(pid), 0) + int(mib) * MIB
    return held
