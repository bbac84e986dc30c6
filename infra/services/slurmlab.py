"""A real Slurm cluster on one machine, for tests: Debian's `slurm-wlm` and `munge`, one
`slurmctld` and one `slurmd` per node, each node a network-namespace host of a `NetLab`.

Everything lives under one folder of the caller's: a munge key and daemon of the lab's own (its
socket there, never the machine's `/run/munge`), `slurm.conf`, state, spool, logs and pid files.
`SlurmLab.env` is what a client command (`sbatch`, `scontrol`, `squeue`) needs to reach this
controller; `run` runs one in the controller's namespace. Needs root, `ip`, and the programs of
`stacx.infra.services.tools` (`stacx infra up` installs them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from stacx.infra.services.netlab import NetLab

__all__ = ["SlurmLab", "slurm_problem"]

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "nsenter")


def slurm_problem() -> str | None:
    """Why this machine cannot run a Slurm lab (None: it can)."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed: run `stacx infra up` (installs slurm-wlm and munge)"
    return None


class SlurmLab:
    """`slurmctld` on `controller`, a `slurmd` on each of `nodes` (hosts of `lab`), one
    partition `lab` of all nodes with `cpus` CPUs and `memory_mb` MB each."""

    def __init__(
        self,
        lab: NetLab,
        root: Path,
        *,
        controller: str,
        nodes: Sequence[str],
        cpus: int = 2,
        memory_mb: int = 4096,
    ) -> None:
        self.lab, self.root, self.controller, self.nodes = lab, root, controller, list(nodes)
        self.cpus, self.memory_mb = cpus, memory_mb
        self.conf = root / "slurm.conf"
        self.socket = root / "munge" / "munge.socket"
        self._munged: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client command of this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmLab:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        for sub in ("munge", "state", "spool", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self.conf.write_text(self.config_text())
        self._daemon(self.controller, ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(exist_ok=True)
            self._daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)], f"slurmd-{node}")
        self.wait_idle(timeout_s=60)

    def _daemon(self, host: str, argv: list[str], name: str) -> None:
        """A daemon in `host`'s network namespace only (`nsenter --net`): unlike `ip netns
        exec`, the machine's /sys stays mounted, so slurmd finds its cgroup hierarchy."""
        lab_host = self.lab.hosts[host]
        with (self.root / "logs" / f"{name}.out").open("ab") as out:
            proc = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{lab_host.netns}", "--", *argv],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True,
            )
        lab_host.processes.append(proc)  # the lab's `close` stops it

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        munge.chmod(0o700)
        with (munge / "munged.out").open("ab") as out:
            self._munged = subprocess.Popen(
                ["munged", "-F", "-f", f"--socket={self.socket}", f"--key-file={key}",
                 f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                 f"--seed-file={munge / 'munged.seed'}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + 20
        while not self.socket.exists():
            if self._munged.poll() is not None or time.monotonic() > deadline:
                said = (munge / "munged.out").read_text(errors="replace")
                raise RuntimeError(f"munged did not start: {said}")
            time.sleep(0.1)

    def config_text(self) -> str:
        """slurm.conf: munge through the lab's socket, no cgroups (process tracking by /proc),
        no accounting database, state and logs under the lab's folder."""
        root, ctl = self.root, self.lab.hosts[self.controller]
        lines = [
            "ClusterName=stacxlab",
            # slurmctld checks its name against the machine's host name, which namespaces share
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({ctl.address})",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}/%n",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={root / 'logs' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'logs'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            "KillWait=30",  # a node stops its services within 20 s of SIGTERM (STOP_GRACE_S)
            *(
                f"NodeName={n} NodeAddr={self.lab.hosts[n].address} CPUs={self.cpus} "
                f"RealMemory={self.memory_mb} State=UNKNOWN"
                for n in self.nodes
            ),
            f"PartitionName=lab Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def run(
        self, argv: Sequence[str], *, timeout_s: float = 60, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A client command, run in the controller's namespace."""
        return self.lab.run(self.controller, argv, timeout_s=timeout_s, env=self.env, cwd=cwd)

    def wait_idle(self, timeout_s: float) -> None:
        """Until every node is idle (registered with the controller)."""
        deadline = time.monotonic() + timeout_s
        states = ""
        while time.monotonic() < deadline:
            done = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout_s=20)
            states = done.stdout.strip()
            lines = states.splitlines()
            if done.returncode == 0 and lines and all(line.endswith(" idle") for line in lines):
                return
            time.sleep(1.0)
        raise RuntimeError(f"Slurm nodes not idle within {timeout_s:.0f}s: {states or 'no answer'}; "
                           f"logs under {self.root / 'logs'}")

    def job_state(self, job_id: str) -> str:
        """The job's state (`PENDING`, `RUNNING`, `COMPLETED`, `FAILED`, ...; `` when unknown)."""
        done = self.run(["scontrol", "show", "job", "-o", job_id], timeout_s=20)
        for field in done.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return ""

    def close(self) -> None:
        """Stop the daemons (the lab's `close` stops slurmctld and the slurmds) and munged."""
        if self._munged is not None and self._munged.poll() is None:
            self._munged.terminate()
            try:
                self._munged.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._munged.kill()
