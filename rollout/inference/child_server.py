"""What an engine that runs as a child process (SGLang, vLLM) shares: waiting until its health
route answers, and stopping its whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx

from stacx.rollout.inference.errors import ServerUnavailableError

__all__ = ["stop_group", "wait_healthy"]


def wait_healthy(process: subprocess.Popen[bytes] | None, url: str, *, engine: str, timeout_s: float,
                 poll_s: float, request_timeout_s: float) -> None:
    """Block until GET `url` answers 200; ServerUnavailableError if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServerUnavailableError(f"{engine} exited with status {process.returncode} while starting")
        try:
            if httpx.get(url, timeout=request_timeout_s).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(poll_s)
    raise ServerUnavailableError(f"{engine} did not answer at {url} in {timeout_s:.0f}s")


def stop_group(process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """SIGTERM to the child's process group (its engine processes are its children), then SIGKILL.
    The child must have been started with `start_new_session=True`."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
