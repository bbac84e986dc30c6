"""Service subprocesses: each pipeline service runs as its own `stacx <service>` command.

Every service gets its own session (process group), so that stopping it also stops what it
spawned (the FSDP2 trainer's ranks), even when the service's main process is already dead; only
process groups this module started are signalled. A `Supervisor` restarts a crashed service with
exponential backoff until its `RestartPolicy` budget is spent; one that exits 2 (its
configuration is wrong) is not restarted, and the run's error quotes the line it said.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat

from stacx.infra.pipeline.errors import ServiceError

__all__ = [
    "CONFIG_ERROR_STATUS",
    "ChildProcess",
    "Launcher",
    "RestartBudget",
    "RestartPolicy",
    "ServiceProcess",
    "ServiceSpec",
    "Supervisor",
    "http_ready",
    "stacx_argv",
]

log = logging.getLogger(__name__)
FORKED = " (forked from the run's preloader)"
"""How a start line and a service log's first line say that the service was forked, not spawned."""
CONFIG_ERROR_STATUS = 2
"""Every `stacx` command exits 2 on a configuration error: such a service is not restarted."""
_COMMAND_LINE = re.compile(r"^stacx( [a-z][a-z-]*)?: |\s(ERROR|CRITICAL)\s")
"""A command's own error line (`stacx train: ...`) or a logged error."""
_NOISE = re.compile(r"nanobind|leaked (type|function|instance)")
"""What an interpreter with nanobind extensions prints at exit: never the cause."""


def stacx_argv() -> list[str]:
    """How to invoke `stacx` with this interpreter (the console script when installed)."""
    script = Path(sys.executable).with_name("stacx")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "stacx.infra.cli"]


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
    finishes: bool = False
    """Exit status 0 means the service is done (the trainer after max_steps): not restarted."""
    program: list[str] | None = None
    """Run this program with `args` instead of `stacx` (tests, external services)."""


class ChildProcess(Protocol):
    """What a `ServiceProcess` needs of its process: `subprocess.Popen`'s names."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class Launcher(Protocol):
    """Starts some `stacx` commands another way than a fresh process (stacx.infra.pipeline.preload)."""

    def takes(self, spec: ServiceSpec) -> bool: ...

    def spawn(self, args: list[str], env: dict[str, str], log_path: Path) -> ChildProcess: ...


class ServiceProcess:
    """A started service: readiness, liveness, log tail, stop."""

    def __init__(self, spec: ServiceSpec, log_dir: Path, *, launcher: Launcher | None = None) -> None:
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.proc: ChildProcess | None = None
        self.launcher = launcher

    def start(self) -> ServiceProcess:
        argv = [*(self.spec.program or stacx_argv()), *self.spec.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        forked = self._forked(argv, env)
        self.proc = forked if forked is not None else self._spawned(argv, env)
        how = FORKED if forked is not None else ""
        log.info("started %s (pid %d): %s%s", self.spec.name, self.proc.pid, " ".join(argv), how)
        return self

    def _forked(self, argv: list[str], env: dict[str, str]) -> ChildProcess | None:
        """The service forked by the launcher, or None when it does not take it or fails."""
        if self.launcher is None or not self.launcher.takes(self.spec):
            return None
        with self.log_path.open("ab") as out:
            out.write(f"$ {' '.join(argv)} {FORKED}\n".encode())
        try:
            return self.launcher.spawn(self.spec.args, env, self.log_path)
        except ServiceError as exc:
            log.warning("%s: %s; starting it as a fresh process", self.spec.name, exc)
            return None

    def _spawned(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as out:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

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

    def finished(self) -> bool:
        """The service exited 0 and `finishes` says that is its end (the trainer after max_steps)."""
        return self.spec.finishes and self.proc is not None and self.proc.poll() == 0

    def error_lines(self) -> str:
        """What the service said when it failed: its `stacx <command>: ...` lines (the one-line
        errors every command prints) when the log has any, else its log tail without the
        interpreter's shutdown noise (nanobind's leak report)."""
        tail = self.tail(200).splitlines()
        said = [line for line in tail if _COMMAND_LINE.match(line)]
        if said:
            return "\n".join(said[-10:])
        return "\n".join([line for line in tail if not _NOISE.search(line)][-25:])

    def check_alive(self) -> None:
        """Raise ServiceError, with what the service said, when it has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServiceError(
                f"service {self.spec.name} exited with status {self.proc.returncode}; "
                f"log {self.log_path}:\n{self.error_lines()}"
            )

    def wait_ready(self, timeout_s: float) -> None:
        """Block until ready; ServiceError when it dies or `timeout_s` passes. A service that
        `finishes` and has already ended with status 0 (a short trainer) was ready: it is done."""
        deadline = time.monotonic() + timeout_s
        settle = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if self.finished():
                return
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

    def terminate(self) -> None:
        """SIGTERM to the service's process group, without waiting (`stop` then waits): a node
        signals all its services at once, so stopping takes the slowest one's time, not the sum."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the service's process group, then SIGKILL after `timeout_s`. When the main
        process is already dead, what is left of its group (spawned ranks) is killed at once."""
        if self.proc is None:
            return
        if self.proc.poll() is not None:
            self._kill_leftovers()
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs: killing it", self.spec.name, timeout_s)
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._kill_leftovers(grace_s=5.0)

    def _kill_leftovers(self, grace_s: float = 0.0) -> None:
        """SIGKILL the rest of the group whose leader has exited (and was reaped by us), after
        `grace_s` for members still on their way out (spawned ranks finishing their SIGTERM)."""
        assert self.proc is not None
        pgid = self.proc.pid
        if _pid_exists(pgid):
            return  # the pid was reused by a stranger: its group is not ours to signal
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_exists(pgid):
            time.sleep(0.1)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return  # nothing left
        log.warning("%s: killed the processes its main process left behind", self.spec.name)

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # the group we created with start_new_session
        except (ProcessLookupError, PermissionError):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


def _group_exists(pgid: int) -> bool:
    """Whether any process is still in the process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(kw_only=True, slots=True)
class RestartPolicy:
    """How a crashed service is restarted (like systemd's Restart=on-failure with a burst limit)."""

    max_restarts: NonNegativeInt = 5
    """Restarts allowed within `window_s`; one more crash fails the run."""
    window_s: PositiveFloat = 600.0
    """Sliding window of the restart budget, in seconds."""
    backoff_s: NonNegativeFloat = 1.0
    """Delay before the first restart in the window; doubled for each further one."""
    max_backoff_s: NonNegativeFloat = 30.0
    """Longest delay between a crash and its restart (at least `backoff_s`)."""

    def __post_init__(self) -> None:
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(f"max_backoff_s={self.max_backoff_s} is below backoff_s={self.backoff_s}; "
                             "raise it or lower backoff_s")


class RestartBudget:
    """Pure bookkeeping of one service's restarts: whether and after which delay it restarts."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._recent: deque[float] = deque()

    def next_delay(self, now: float) -> float | None:
        """Record a crash at `now`; the delay before its restart, or None when the budget is
        spent (`max_restarts` restarts already happened within the last `window_s`)."""
        while self._recent and now - self._recent[0] >= self.policy.window_s:
            self._recent.popleft()
        if len(self._recent) >= self.policy.max_restarts:
            return None
        delay = min(self.policy.backoff_s * 2 ** len(self._recent), self.policy.max_backoff_s)
        self._recent.append(now)
        return delay


class Supervisor:
    """Keeps services running: `poll()` notices a crash, kills what the service left behind,
    waits out the backoff and starts it again; ServiceError once a budget is spent."""

    def __init__(self, policy: RestartPolicy, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self.services: dict[str, ServiceProcess] = {}
        self.restarts: dict[str, int] = {}
        """Restarts per service so far."""
        self._budgets: dict[str, RestartBudget] = {}
        self._due: dict[str, float] = {}

    def add(self, service: ServiceProcess) -> None:
        name = service.spec.name
        self.services[name] = service
        self._budgets.setdefault(name, RestartBudget(self.policy))
        self.restarts.setdefault(name, 0)
        self._due.pop(name, None)

    def remove(self, name: str) -> None:
        """Stop supervising `name` (before a deliberate stop)."""
        self.services.pop(name, None)
        self._due.pop(name, None)

    def finished(self, name: str) -> bool:
        """The service exited 0 and `finishes` says that is its end."""
        return self.services[name].finished()

    def poll(self) -> list[str]:
        """Check every service once; returns the names restarted by this call."""
        restarted = []
        for name, service in self.services.items():
            if service.alive() or self.finished(name):
                continue
            if name not in self._due:
                self._crashed(name, service)
            elif self.clock() >= self._due[name]:
                del self._due[name]
                self.restarts[name] += 1
                service.start()
                restarted.append(name)
        return restarted

    def _crashed(self, name: str, service: ServiceProcess) -> None:
        assert service.proc is not None
        status = service.proc.returncode
        service.stop()  # what the dead service left of its group (ranks) goes too
        if status == CONFIG_ERROR_STATUS:  # a restart would fail the same way
            raise ServiceError(
                f"service {name} refused its configuration (exit status {status}, not restarted); "
                f"log {service.log_path}:\n{service.error_lines()}"
            )
        delay = self._budgets[name].next_delay(self.clock())
        if delay is None:
            raise ServiceError(
                f"service {name} exited with status {status} and has used its restart budget "
                f"({self.policy.max_restarts} restarts within {self.policy.window_s:.0f}s); "
                f"log {service.log_path}:\n{service.error_lines()}"
            )
        log.warning(
            "service %s exited with status %s: restart %d in %.1fs (log %s)",
            name,
            status,
            self.restarts[name] + 1,
            delay,
            service.log_path,
        )
        self._due[name] = self.clock() + delay
