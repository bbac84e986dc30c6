"""Small process helpers: pid files, liveness, ports, stopping what we started."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from stacx.infra.services.errors import InfraError


def read_pid(pid_file: Path) -> int | None:
    """The pid recorded in `pid_file` if that process is still alive."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def stop_pid(pid: int, timeout_s: float = 30.0) -> None:
    """SIGTERM, wait, then SIGKILL: only ever called on pids we recorded ourselves."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def port_holder(port: int) -> str:
    """`name (pid N)` of the process listening on `port`, or a hint when it cannot be told."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return "an unknown process"
                return f"{psutil.Process(conn.pid).name()} (pid {conn.pid})"
    except Exception:  # psutil missing or access denied: fall back to a hint
        pass
    return f"an unknown process (try `ss -ltnp 'sport = :{port}'`)"


def require_free_port(host: str, port: int, what: str, env_var: str) -> None:
    if port_open(host, port):
        raise InfraError(
            f"port {port} on {host} (needed by {what}) is already in use by {port_holder(port)}; "
            f"stop that process or choose another port with {env_var}=<port>"
        )


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"
