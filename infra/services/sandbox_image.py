"""The sandbox base image `stacx/sandbox:bookworm`, built once from Debian packages.

No image registry is needed: `debootstrap --variant=minbase` (+ python3) makes a root file system
from the Debian mirror this machine's apt already uses, and `docker import` turns it into an image.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from stacx.infra import paths
from stacx.infra.services import tools
from stacx.infra.services.errors import InfraError

IMAGE = "stacx/sandbox:bookworm"
SUITE = "bookworm"
PACKAGES = ("python3", "bash", "coreutils", "ca-certificates")
SANDBOX_UID = 1000
IMPORT_CHANGES = (
    'CMD ["/bin/bash"]',
    "WORKDIR /workspace",
    "ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1",
    "LABEL org.stacx.image=sandbox-base",
)


def log_file() -> Path:
    return paths.logs_dir() / "sandbox-image.log"


def image_exists(image: str = IMAGE, timeout_s: float = 30.0) -> bool:
    try:
        proc = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise InfraError(
            f"`docker image inspect {image}` did not answer within {timeout_s:.0f}s: the Docker engine "
            "is wedged (`stacx infra status`; `stacx infra up` restarts a dockerd it started)"
        ) from exc
    return proc.returncode == 0


def up() -> str:
    if image_exists():
        return f"sandbox image {IMAGE}: present"
    mirror = debian_mirror()
    tools.ensure(["debootstrap"], say=lambda line: print(f"[stacx infra] {line}"))
    print(
        f"[stacx infra] building {IMAGE} with debootstrap (once per machine, a few minutes; log {log_file()})"
    )
    with tempfile.TemporaryDirectory(prefix="stacx-rootfs-", dir=paths.stacx_home()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(rootfs, mirror)
        _prepare_rootfs(rootfs)
        _import(rootfs)
    return f"sandbox image {IMAGE}: built"


def debian_mirror() -> str:
    """The Debian mirror: $STACX_DEBIAN_MIRROR, else the one this machine's apt is configured with."""
    if mirror := os.environ.get("STACX_DEBIAN_MIRROR"):
        return mirror
    for source in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if mirror := _mirror_in(source):
            return mirror
    raise InfraError(
        "cannot tell which Debian mirror to use: no `bookworm` source in /etc/apt; "
        "set STACX_DEBIAN_MIRROR=<mirror URL of the Debian archive>"
    )


def _mirror_in(source: Path) -> str | None:
    try:
        text = source.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        match = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+" + SUITE + r"\s", line + " ")
        if match and "security" not in match.group(1):
            return match.group(1)
    for stanza in text.split("\n\n"):
        uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
        suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
        if uris and suites and SUITE in suites.group(1).split() and "security" not in uris.group(1):
            return uris.group(1)
    return None


def _debootstrap(rootfs: Path, mirror: str) -> None:
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), mirror]
    with open(log_file(), "wb") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log_file().read_text(errors="replace").splitlines()[-20:])
        raise InfraError(
            f"debootstrap failed (mirror {mirror}); check that the mirror is reachable "
            f"or set STACX_DEBIAN_MIRROR. Last lines of {log_file()}:\n{tail}"
        )


def _prepare_rootfs(rootfs: Path) -> None:
    """A non-root `sandbox` user (uid 1000) owning /workspace; no apt caches in the image."""
    with open(rootfs / "etc/passwd", "a") as passwd:
        passwd.write(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/workspace:/bin/bash\n")
    with open(rootfs / "etc/group", "a") as group:
        group.write(f"sandbox:x:{SANDBOX_UID}:\n")
    for directory in ("workspace", "logs", "tests"):
        (rootfs / directory).mkdir(exist_ok=True)
        os.chown(rootfs / directory, SANDBOX_UID, SANDBOX_UID)
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)


def _import(rootfs: Path) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    cmd = ["docker", "import"]
    for change in IMPORT_CHANGES:
        cmd += ["--change", change]
    proc = subprocess.run([*cmd, "-", IMAGE], stdin=tar.stdout, capture_output=True, text=True)
    tar.wait()
    if proc.returncode != 0 or tar.returncode != 0:
        raise InfraError(f"`docker import` of the sandbox root file system failed: {proc.stderr}")


def status() -> str:
    return f"sandbox image {IMAGE}: {'present' if image_exists() else 'missing'}"
