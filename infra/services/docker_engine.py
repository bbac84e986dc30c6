"""The Docker engine sandboxes run on.

If no engine answers and this machine allows it (root on Debian), `up()` installs `docker.io` and
starts `dockerd --bridge=none --iptables=false`: no bridge network and no private addresses; sandboxes
run with `--network none`, image builds with `--network host`.

Every probe of the engine has a short timeout: Docker 20.10 can wedge (a libnetwork deadlock under
many concurrent container starts), and then even `docker info` hangs. `up()` restarts a wedged
dockerd that it started itself (by its pid file); `status()` says the engine is wedged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stacx.infra import paths
from stacx.infra.services import tools
from stacx.infra.services.errors import InfraError
from stacx.infra.services.processes import pid_alive, read_pid, stop_pid, tail

START_TIMEOUT_S = 60.0


def log_file() -> Path:
    return paths.logs_dir() / "dockerd.log"


def pid_file() -> Path:
    return paths.run_dir() / "dockerd.pid"


PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class EngineState:
    """What one `docker info` probe saw."""

    state: Literal["answers", "down", "wedged", "absent"]
    version: str = ""


def probe(timeout_s: float | None = None) -> EngineState:
    """`docker info` with a timeout: answers, down (refused), wedged (no answer in time), absent."""
    if shutil.which("docker") is None:
        return EngineState("absent")
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S if timeout_s is None else timeout_s,
        )
    except subprocess.TimeoutExpired:
        return EngineState("wedged")
    return EngineState("answers", proc.stdout.strip()) if proc.returncode == 0 else EngineState("down")


def engine_answers() -> bool:
    return probe().state == "answers"


def up() -> str:
    engine = probe()
    pid = read_pid(pid_file())
    if engine.state == "answers":
        owner = f"started by stacx, pid {pid}" if pid else "not started by stacx"
        return f"Docker engine already running ({owner})"
    if engine.state == "wedged":
        _restart_wedged(pid)
    _check_can_manage()
    tools.ensure(["docker", "dockerd"], say=lambda line: print(f"[stacx infra] {line}"))
    pid = _spawn()
    _wait_ready(pid)
    return f"Docker engine started (dockerd pid {pid}, log {log_file()})"


def _restart_wedged(pid: int | None) -> None:
    if pid is None:
        raise InfraError(
            f"the Docker engine does not answer `docker info` within {PROBE_TIMEOUT_S:.0f}s (wedged?) "
            "and stacx did not start it: restart it yourself (e.g. `systemctl restart docker`), "
            "then rerun `stacx infra up`; see docs/infra.md (known Docker 20.10 deadlock)"
        )
    print(
        f"[stacx infra] the Docker engine (dockerd pid {pid}, started by stacx) does not answer within "
        f"{PROBE_TIMEOUT_S:.0f}s: wedged; writing its goroutine dump (see {log_file()}) and restarting it",
        flush=True,
    )
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
    stop_pid(pid, timeout_s=30)
    pid_file().unlink(missing_ok=True)


def _check_can_manage() -> None:
    if os.geteuid() != 0:
        raise InfraError(
            "no Docker engine answers (`docker info` failed) and stacx can only start one "
            "as root; start dockerd yourself or add your user to the `docker` group"
        )
    if not Path("/etc/debian_version").exists():
        raise InfraError(
            "no Docker engine answers (`docker info` failed) and this is not a Debian "
            "machine: install and start Docker Engine, then rerun `stacx infra up`"
        )


def _spawn() -> int:
    cmd = [
        "dockerd",
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--pidfile",
        str(paths.run_dir() / "dockerd.engine.pid"),
    ]
    with open(log_file(), "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    pid_file().write_text(str(proc.pid))
    return proc.pid


def _wait_ready(pid: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            pid_file().unlink(missing_ok=True)
            raise InfraError(
                f"dockerd exited during start-up; last lines of {log_file()}:\n{tail(log_file())}"
            )
        if engine_answers():
            return
        time.sleep(0.5)
    raise InfraError(
        f"dockerd did not answer within {START_TIMEOUT_S:.0f}s; last lines of "
        f"{log_file()}:\n{tail(log_file())}"
    )


def down() -> str:
    pid = read_pid(pid_file())
    if pid is None:
        pid_file().unlink(missing_ok=True)
        return "Docker engine: not started by stacx (left alone)"
    stop_pid(pid, timeout_s=60)
    pid_file().unlink(missing_ok=True)
    return f"Docker engine: stopped dockerd pid {pid}"


def status() -> tuple[bool, str]:
    """(healthy, one line) for `stacx infra status`; never hangs on a wedged engine."""
    pid = read_pid(pid_file())
    owner = f"dockerd pid {pid} started by stacx" if pid else "not started by stacx"
    engine = probe()
    if engine.state == "wedged":
        fix = "`stacx infra up` restarts it" if pid else "restart dockerd"
        return False, (
            f"Docker engine not answering within {PROBE_TIMEOUT_S:.0f}s (wedged?; {owner}): {fix}; "
            f"log {log_file()}, docs/infra.md"
        )
    if engine.state != "answers":
        return (
            False,
            f"Docker engine: not answering ({engine.state}; `stacx infra up` starts it), log {log_file()}",
        )
    return True, f"Docker engine {engine.version}: running ({owner}), log {log_file()}"
