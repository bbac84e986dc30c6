"""Every external program the code runs, and how a fresh machine gets it.

`stacx infra up` installs what is missing (root on Debian, from the Debian packages) before it starts
anything, so `make test` and `make demo` never depend on something installed by hand. A unit test
scans the source for programs the code runs and fails when one is not listed here; an integration
test checks that every listed program is on PATH after `stacx infra up`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from stacx.infra.services.errors import InfraError

__all__ = ["TOOLS", "Tool", "ensure", "missing"]


@dataclass(frozen=True, slots=True)
class Tool:
    """One program the code runs."""

    executable: str
    """Name looked up on PATH."""
    package: str
    """Debian package that provides it."""
    used_by: str
    """What needs it (shown in errors)."""


TOOLS: dict[str, Tool] = {
    tool.executable: tool
    for tool in (
        Tool(executable="docker", package="docker.io", used_by="the Docker engine check and image builds"),
        Tool(executable="dockerd", package="docker.io", used_by="the local Docker engine"),
        Tool(executable="bwrap", package="bubblewrap", used_by="the process sandbox backend"),
        Tool(executable="debootstrap", package="debootstrap", used_by="building the sandbox base image"),
        Tool(executable="java", package="openjdk-17-jre-headless", used_by="the local Kafka broker"),
        Tool(executable="mvn", package="maven", used_by="Maven, resolving the Kafka jars"),
        Tool(executable="tar", package="tar", used_by="importing the sandbox base image"),
        Tool(executable="bash", package="bash", used_by="the peer benchmark's tool runner"),
        Tool(executable="apt-get", package="apt", used_by="installing the tools above"),
        Tool(executable="go", package="golang-go", used_by="building the Jaeger trace backend (once)"),
        Tool(executable="flock", package="util-linux", used_by="make setup (one venv build at a time)"),
        Tool(executable="chromium", package="chromium", used_by="`stacx view` browser tests"),
        Tool(executable="chromedriver", package="chromium-driver", used_by="`stacx view` browser tests"),
        Tool(executable="ip", package="iproute2", used_by="network-namespace hosts (cluster tests)"),
        Tool(executable="systemd-analyze", package="systemd", used_by="checking the systemd unit example"),
        Tool(executable="munged", package="munge", used_by="the test Slurm cluster's authentication"),
        Tool(executable="slurmctld", package="slurmctld", used_by="the test Slurm cluster's controller"),
        Tool(executable="slurmd", package="slurmd", used_by="the test Slurm cluster's nodes"),
        Tool(executable="sbatch", package="slurm-client", used_by="submitting examples/cluster/sbatch.sh"),
        Tool(executable="scontrol", package="slurm-client", used_by="the sbatch example and the Slurm lab"),
        Tool(executable="squeue", package="slurm-client", used_by="the test Slurm cluster"),
        Tool(executable="sinfo", package="slurm-client", used_by="the test Slurm cluster"),
        Tool(executable="srun", package="slurm-client", used_by="the sbatch example's job steps"),
        Tool(executable="scancel", package="slurm-client", used_by="the test Slurm cluster"),
        Tool(executable="nsenter", package="util-linux", used_by="Slurm nodes in network namespaces"),
    )
}
"""executable -> Tool. Keep in step with what the code runs (tests/unit/infra/test_tools.py)."""


def missing(names: Iterable[str] | None = None) -> list[Tool]:
    """Listed tools (all by default) that are not on PATH."""
    wanted = TOOLS.values() if names is None else [TOOLS[name] for name in names]
    return [tool for tool in wanted if shutil.which(tool.executable) is None]


def ensure(names: Iterable[str] | None = None, say: Callable[[str], None] = print) -> list[str]:
    """Install the missing ones from the Debian packages (root on Debian); InfraError otherwise.
    Returns the packages installed."""
    absent = missing(names)
    if not absent:
        return []
    packages = sorted({tool.package for tool in absent})
    fix = f"install them with `apt-get install -y {' '.join(packages)}` and rerun `stacx infra up`"
    if os.geteuid() != 0 or not Path("/etc/debian_version").exists():
        raise InfraError(
            f"{_describe(absent)} not installed (stacx installs them as root on Debian only); {fix}"
        )
    say(f"installing {' '.join(packages)} from the Debian packages")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        except FileNotFoundError as exc:
            raise InfraError(
                f"{_describe(absent)} not installed and {exc.filename} is missing; {fix}"
            ) from exc
        if proc.returncode != 0:
            raise InfraError(
                f"`{' '.join(cmd)}` failed while installing {_describe(absent)}; {fix}:\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
    still = missing(names)
    if still:
        raise InfraError(f"{_describe(still)} still not on PATH after installing {' '.join(packages)}")
    return packages


def _describe(tools: list[Tool]) -> str:
    return ", ".join(f"`{t.executable}` (for {t.used_by})" for t in tools)
