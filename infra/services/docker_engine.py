"""The Docker engine sandboxes run on.

If no engine answers and this machine allows it (root on Debian), `up()` installs `docker.io` and
starts `dockerd --bridge=none --iptables=false`: no bridge network and no private addresses; sandboxes
run with `--network none`, image builds with `--network host`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from infra import paths
from infra.services import tools
from infra.services.errors import InfraError
from infra.services.processes import pid_alive, read_pid, stop_pid, tail

START_TIMEOUT_S = 60.0


def log_file() -> Path:
    return paths.logs_dir() / "dockerd.log"


def pid_file() -> Path:
    return paths.run_dir() / "dockerd.pid"


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    proc = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=30
    )
    return proc.returncode == 0


def up() -> str:
    if engine_answers():
        pid = read_pid(pid_file())
        owner = f"started by stacx, pid {pid}" if pid else "not started by stacx"
        return f"Docker engine already running ({owner})"
    _check_can_manage()
    tools.ensure(["docker", "dockerd"], say=lambda line: print(f"[stacx infra] {line}"))
    pid = _spawn()
    _wait_ready(pid)
    return f"Docker engine started (dockerd pid {pid}, log {log_file()})"


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


def status() -> str:
    pid = read_pid(pid_file())
    if not engine_answers():
        return f"Docker engine: not answering (log {log_file()})"
    owner = f"dockerd pid {pid} started by stacx" if pid else "not started by stacx"
    version = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True
    ).stdout.strip()
    return f"Docker engine {version}: running ({owner}), log {log_file()}"
