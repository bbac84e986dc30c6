"""Service subprocesses: each pipeline service runs as its own `stacx <service>` command.

Every service gets its own session (process group), so that stopping it also stops what it
spawned (the FSDP2 trainer's ranks); only process groups this module started are signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.pipeline.errors import ServiceError

__all__ = ["ServiceProcess", "ServiceSpec", "http_ready", "stacx_argv"]

log = logging.getLogger(__name__)


def stacx_argv() -> list[str]:
    """How to invoke `stacx` with this interpreter (the console script when installed)."""
    script = Path(sys.executable).with_name("stacx")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "infra.cli"]


def http_ready(url: str, timeout_s: float = 2.0) -> bool:
    """True when GET `url` answers 2xx."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout_s).is_success
    except httpx.HTTPError:
        return False


@dataclass(kw_only=True, slots=True)
class ServiceSpec:
    """One service: its `stacx` subcommand line and how to tell that it is ready."""

    name: str
    """Short name (log file `<name>.log`)."""
    args: list[str]
    """Arguments after `stacx`, e.g. ["serve", "--model", DIR]."""
    ready_url: str | None = None
    """GET this until it answers 2xx; None: ready once started and still alive after a moment."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables."""


class ServiceProcess:
    """A started service: readiness, liveness, log tail, stop."""

    def __init__(self, spec: ServiceSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        argv = [*stacx_argv(), *self.spec.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as out:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        log.info("started %s (pid %d): %s", self.spec.name, self.proc.pid, " ".join(argv))
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def check_alive(self) -> None:
        """Raise ServiceError, with the log tail, when the service has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServiceError(
                f"service {self.spec.name} exited with status {self.proc.returncode}; "
                f"log {self.log_path}:\n{self.tail()}"
            )

    def wait_ready(self, timeout_s: float) -> None:
        """Block until ready; ServiceError when it dies or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        settle = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            self.check_alive()
            if self.spec.ready_url is None:
                if time.monotonic() >= settle:
                    return
            elif http_ready(self.spec.ready_url):
                return
            time.sleep(0.5)
        raise ServiceError(
            f"service {self.spec.name} was not ready within {timeout_s:.0f}s "
            f"(waiting for {self.spec.ready_url or 'start-up'}); log {self.log_path}:\n"
            f"{self.tail()}"
        )

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the service's process group, then SIGKILL after `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs: killing it", self.spec.name, timeout_s)
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._signal(signal.SIGKILL, group_only=True)  # leftovers of the group (spawned ranks)

    def _signal(self, sig: signal.Signals, *, group_only: bool = False) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # the group we created with start_new_session
        except (ProcessLookupError, PermissionError):
            if not group_only:
                try:
                    self.proc.send_signal(sig)
                except ProcessLookupError:
                    pass
