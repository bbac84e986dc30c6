"""Memory per service of a run: resident memory of each service's process tree (psutil) and the
GPU memory its processes hold (NVML, where there is an NVIDIA driver), as `memory/<service>/*_gb`."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import psutil

__all__ = ["gpu_memory_by_pid", "service_memory"]

log = logging.getLogger(__name__)

GB = 1024**3


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
    """Bytes of GPU memory per process id, from NVML (NVIDIA's own library, `nvidia-ml-py`);
    empty on a machine without an NVIDIA driver."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver: a CPU machine
        log.debug("tracking: NVML: %s", exc)
        return {}
    try:
        held: dict[int, int] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            device = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(device):
                held[process.pid] = held.get(process.pid, 0) + int(process.usedGpuMemory or 0)
        return held
    except pynvml.NVMLError as exc:  # a device gone or busy: no GPU figures this time
        log.debug("tracking: NVML: %s", exc)
        return {}
    finally:
        pynvml.nvmlShutdown()
