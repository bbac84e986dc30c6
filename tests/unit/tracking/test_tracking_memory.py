"""Memory per service: a real process tree's resident memory, and nvidia-smi's per-process lines."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from stacx.infra.tracking.memory import gpu_memory_by_pid, service_memory


def test_a_service_counts_its_whole_process_tree_and_a_gone_one_is_left_out() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; x = b\"x\" * (64 << 20); time.sleep(30)"])
    try:
        psutil.Process(child.pid).memory_info()  # it exists
        own = psutil.Process().memory_info().rss
        for _ in range(50):  # until the child has touched its 64 MiB
            if psutil.Process(child.pid).memory_info().rss > 64 << 20:
                break
            time.sleep(0.1)
        figures = service_memory({"trainer": os.getpid(), "gone": 2**22 + 7})
        assert figures["memory/trainer/rss_gb"] * 1024**3 >= own + (64 << 20)  # it and its child
        assert not [k for k in figures if k.startswith("memory/gone/")]
    finally:
        child.kill()
        child.wait()


def test_without_an_nvidia_driver_there_are_no_gpu_figures() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert gpu_memory_by_pid() == {}  # this machine: NVML finds no driver
        return
    pynvml.nvmlShutdown()
    held = gpu_memory_by_pid()  # a GPU machine: every pid it names is a process
    assert all(pid > 0 and size >= 0 for pid, size in held.items())
