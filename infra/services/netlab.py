"""Hosts on one machine: Linux network namespaces, each with its own address, for tests and
benchmarks of a cluster (`tests/integration/infra/test_kafka_cluster.py`, `bench/cluster.py`).

`NetLab` creates one namespace per host plus one "switch" namespace holding a bridge; each host
gets a veth pair, one end (`eth0`, its address) in the host's namespace and the other on the
bridge. A host is lost by SIGKILL (`kill_host`) or by a partition (`cut`, then `heal`).
Nothing is added to the machine's own namespace: traffic only goes between the namespaces the
lab made. Every name carries the lab's unique prefix; `close()` (also on error)
stops the processes the lab started, by their process groups, and deletes its namespaces, which
takes the veth pairs and the bridge with them. Needs root and `ip` (iproute2).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LabHost", "NetLab", "join_netns", "lab_home", "netlab_problem", "stop_group", "stop_groups"]

CLONE_NEWNET = 0x40000000
"""setns(2)'s flag for a network namespace."""

log = logging.getLogger(__name__)

SUBNET = "10.231.0.0/24"
"""Host addresses (inside the lab's namespaces only)."""


def lab_home(root: Path) -> Path:
    """A STACX_HOME of a lab's own under `root`, with the Kafka jars `stacx infra up` installed
    linked in (the lab's brokers keep their data and logs apart from the machine's broker)."""
    from stacx.infra.services import kafka

    jars = kafka.jar_dir()
    home = root / "home"
    target = home / "kafka" / jars.parent.name / "libs"
    target.parent.mkdir(parents=True)
    target.symlink_to(jars)
    return home


def netlab_problem() -> str | None:
    """Why this machine cannot run a lab (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    return None


@dataclass(kw_only=True, slots=True)
class LabHost:
    name: str
    address: str
    netns: str
    port: str = ""
    """Its veth's end on the lab's bridge (in the switch namespace): down = the cable pulled."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def interface(self) -> str:
        return "eth0"


class NetLab:
    """Namespaced hosts on a bridge; see the module docstring."""

    def __init__(self, names: Sequence[str], *, prefix: str | None = None) -> None:
        self.prefix = prefix or f"sx{secrets.token_hex(3)}"
        self.switch = f"{self.prefix}-switch"
        network = ipaddress.ip_network(SUBNET)
        addresses = list(network.hosts())[1:]
        self.hosts = {
            name: LabHost(name=name, address=str(addresses[i]), netns=f"{self.prefix}-{name}")
            for i, name in enumerate(names)
        }
        self._made: list[str] = []

    # -- life cycle --------------------------------------------------------------------------

    def __enter__(self) -> NetLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self._netns_add(self.switch)
        self._ip(self.switch, "link", "add", "br0", "type", "bridge")
        self._ip(self.switch, "link", "set", "br0", "up")
        self._ip(self.switch, "link", "set", "lo", "up")
        for i, host in enumerate(self.hosts.values()):
            self._netns_add(host.netns)
            outer = host.port = f"{self.prefix}p{i}"  # <= 15 characters: the kernel's limit
            self._ip(host.netns, "link", "add", "eth0", "type", "veth", "peer", "name", outer)
            self._ip(host.netns, "link", "set", outer, "netns", self.switch)
            self._ip(self.switch, "link", "set", outer, "master", "br0")
            self._ip(self.switch, "link", "set", outer, "up")
            self._ip(host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            self._ip(host.netns, "link", "set", "eth0", "up")
            self._ip(host.netns, "link", "set", "lo", "up")

    def close(self) -> None:
        """Stop every process the lab started, then delete its namespaces (veths and bridge go too)."""
        stop_groups([proc for host in self.hosts.values() for proc in host.processes])
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()

    def _netns_add(self, name: str) -> None:
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        self._made.append(name)

    @staticmethod
    def _ip(netns: str, *args: str) -> None:
        done = subprocess.run(["ip", "-n", netns, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ip -n {netns} {' '.join(args)}: {done.stderr.strip()}")

    # -- processes ---------------------------------------------------------------------------

    def start(
        self,
        host: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run `argv` in `host`'s namespace, in a session (process group) of its own."""
        lab_host = self.hosts[host]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", lab_host.netns, *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        lab_host.processes.append(proc)
        return proc

    def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout_s: float,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` to its end in `host`'s namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[host].netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )

    def cut(self, host: str) -> None:
        """A network partition: `host`'s port on the bridge goes down. Its processes live on and
        see no error (their own `eth0` stays up); peers hear nothing from it, as when a link or
        a switch fails: only their timeouts notice."""
        self._ip(self.switch, "link", "set", self.hosts[host].port, "down")

    def heal(self, host: str) -> None:
        """The partition of `host` ends: its port on the bridge comes back up."""
        self._ip(self.switch, "link", "set", self.hosts[host].port, "up")

    def kill_host(self, host: str) -> None:
        """The host is lost: SIGKILL to every process it runs, services included (every process
        of the host's namespace that the lab started, and what they started, by session)."""
        for proc in self.hosts[host].processes:
            for sid in {proc.pid, *_sessions_below(proc.pid)}:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(sid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out += [int(t) for t in text]
    return out


def _sessions_below(pid: int) -> set[int]:
    """Session ids of every descendant of `pid` (services run in sessions of their own)."""
    found: set[int] = set()
    todo = _children(pid)
    while todo:
        child = todo.pop()
        with contextlib.suppress(OSError):
            found.add(os.getsid(child))
        todo += _children(child)
    return found


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM to the process's group (it stops what it started), then SIGKILL to what is left."""
    stop_groups([proc], timeout_s)


def stop_groups(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 60.0) -> None:
    """`stop_group` for many at once: every group signalled first, then one shared wait, so a
    lab of many hosts stops in the slowest one's time, not in the sum."""
    below = {proc.pid: _sessions_below(proc.pid) if proc.poll() is None else set() for proc in procs}
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("netlab: pid %d did not stop within %.0fs: killing it", proc.pid, timeout_s)
        for sid in {proc.pid, *below[proc.pid]}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def join_netns(netns: str) -> None:
    """This thread (and every thread and process it starts from now on) joins `netns` (a lab
    host's), so that a driver can live on the lab's network; call it before other threads start."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
    finally:
        os.close(fd)
