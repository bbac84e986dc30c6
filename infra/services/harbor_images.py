"""Local stand-ins for the public base images Harbor tasks start FROM, and the verifier tools image.

This machine has no image registry. `FROM ubuntu:24.04` is resolved through the base-image map of
`stacx.sandbox.images` to a local image built here: Debian bookworm from `debootstrap` (the Debian mirror
this machine's apt uses), with that mirror in its apt sources so task Dockerfiles can still
`apt-get install` at build time (builds use the host network). The verifier tools image holds what
the standard Harbor `tests/test.sh` downloads at verify time (uv/uvx, pytest wheels, a relocatable
python3 and curl) so that verifiers run without internet; sessions mount it at
`stacx.sandbox.images.TOOLS_DIR`.

The stand-ins trust what this machine trusts: the certificates of the host's CA bundle that Debian's
lacks (a TLS-intercepting proxy's) join the image's bundle, and the host's pip configuration
(index, trusted hosts) becomes the image's /etc/pip.conf, so `pip install` in a task Dockerfile
works where it works on the host. An image built for another host trust is rebuilt.
"""

from __future__ import annotations

import configparser
import hashlib
import io
import os
import re
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stacx.infra import paths
from stacx.infra.services import tools
from stacx.infra.services.errors import InfraError
from stacx.infra.services.sandbox_image import debian_mirror, image_exists
from stacx.sandbox.images import STAND_IN_DEBIAN, STAND_IN_PYTHON, TOOLS_DIR, TOOLS_IMAGE

__all__ = [
    "STAND_INS",
    "TOOLS_REQUIREMENTS",
    "HostTrust",
    "build",
    "build_stand_in",
    "build_tools",
    "host_trust",
    "install_host_trust",
]

SUITE = "bookworm"
TOOLS_REQUIREMENTS = ("pytest==8.4.1", "pytest-json-ctrf==0.3.5", "pytest", "exceptiongroup", "tomli")
"""Wheels the offline verifier offers to `uvx --with ...` (the standard test.sh pins the first two)."""

_PYTHON_DOCKERFILE = f"""FROM {STAND_IN_DEBIAN}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \\
    && ln -sf python3 /usr/bin/python && ln -sf pip3 /usr/bin/pip \\
    && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && rm -rf /var/lib/apt/lists/*
"""

_TOOLS_DOCKERFILE = f"""FROM {STAND_IN_DEBIAN}
RUN apt-get update && apt-get install -y --no-install-recommends python3 curl ca-certificates patchelf \\
    && rm -rf /var/lib/apt/lists/*
COPY bundle.sh /tmp/bundle.sh
COPY uv uvx /tmp/uv/
COPY wheels/ {TOOLS_DIR}/wheels/
RUN bash /tmp/bundle.sh {TOOLS_DIR} && rm -rf /tmp/bundle.sh /tmp/uv
LABEL org.stacx.image=harbor-tools
"""

# Copies python3 and curl with every shared library they load (and the dynamic loader) under the
# tools directory and points their ELF interpreter and RPATH there, so they run in any Linux
# image whatever its libc; uv is the static musl build.
_BUNDLE_SH = r"""set -euo pipefail
T=$1
PYV=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
mkdir -p "$T/bin" "$T/lib" "$T/python/bin" "$T/python/lib"
cp -a "/usr/lib/python$PYV" "$T/python/lib/"
rm -rf "$T/python/lib/python$PYV/test" "$T/python/lib/python$PYV/EXTERNALLY-MANAGED"
cp "/usr/bin/python$PYV" "$T/python/bin/"
ln -s "python$PYV" "$T/python/bin/python3"
cp /usr/bin/curl "$T/bin/curl"
install -m 0755 /tmp/uv/uv /tmp/uv/uvx "$T/bin/"
elves=("$T/python/bin/python$PYV" "$T/bin/curl" "$T/python/lib/python$PYV"/lib-dynload/*.so)
for f in "${elves[@]}"; do ldd "$f" | awk '/=> \//{print $3}'; done | sort -u | xargs -I{} cp -L {} "$T/lib/"
cp -L /lib64/ld-linux-x86-64.so.2 "$T/lib/"
for f in "$T/python/bin/python$PYV" "$T/bin/curl"; do
  patchelf --set-interpreter "$T/lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$T/lib" "$f"
done
for f in "$T/python/lib/python$PYV"/lib-dynload/*.so "$T"/lib/*.so*; do
  case "$f" in *ld-linux*) continue;; esac
  patchelf --force-rpath --set-rpath "$T/lib" "$f"
done
"$T/python/bin/python3" -c 'import ssl, json, sqlite3; print("python ok")'
"$T/bin/uv" --version
"""

STAND_INS: dict[str, str] = {
    STAND_IN_DEBIAN: "Debian bookworm (debootstrap minbase), stand-in for ubuntu/debian images",
    STAND_IN_PYTHON: "Debian bookworm + python3, pip (no PEP 668 marker), stand-in for python images",
    TOOLS_IMAGE: "offline verifier tools: uv/uvx, pytest wheels, relocatable python3 and curl",
}


CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
"""Debian's CA bundle (relative to the root file system)."""
HOST_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)
"""Where hosts keep their CA bundle, in the order looked at (after $SSL_CERT_FILE)."""
PIP_CONFIGS = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "~/.config/pip/pip.conf", "~/.pip/pip.conf")
"""pip's configuration files, lowest precedence first (pip's own order; $PIP_CONFIG_FILE last)."""
TRUST_LABEL = "org.stacx.host-trust"
_PIP_ENV = {
    "PIP_INDEX_URL": "index-url",
    "PIP_EXTRA_INDEX_URL": "extra-index-url",
    "PIP_TRUSTED_HOST": "trusted-host",
}
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


@dataclass(frozen=True, slots=True)
class HostTrust:
    """What this machine trusts that a fresh Debian image does not know."""

    certificates: tuple[bytes, ...] = ()
    """PEM certificates of the host's CA bundle."""
    pip_conf: str = ""
    """The host's effective pip configuration (files and PIP_* variables merged), `cert` left out:
    the image's own bundle holds the host's certificates."""

    @property
    def digest(self) -> str:
        """Identifies this trust (the label a stand-in built for it carries)."""
        text = b"".join(self.certificates) + self.pip_conf.encode()
        return hashlib.sha256(text).hexdigest()[:16]


def host_trust(env: Mapping[str, str] = os.environ) -> HostTrust:
    """The certificates this machine trusts (its CA bundle, the first of `HOST_CA_BUNDLES`, and
    any bundle named by $SSL_CERT_FILE, $REQUESTS_CA_BUNDLE, $PIP_CERT or pip's `cert`) and its
    pip configuration."""
    config = configparser.ConfigParser(interpolation=None)
    files = [Path(f).expanduser() for f in (*PIP_CONFIGS, env.get("PIP_CONFIG_FILE", "")) if f]
    config.read([f for f in files if f.is_file()])
    for variable, option in _PIP_ENV.items():
        if env.get(variable):
            config.setdefault("global", {})
            config["global"][option] = env[variable]
    named = [env.get(v, "") for v in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT")]
    named += [config.get(section, "cert", fallback="") for section in config.sections()]
    system = next((b for b in HOST_CA_BUNDLES if Path(b).is_file()), "")
    certificates: list[bytes] = []
    for bundle in dict.fromkeys(b for b in (system, *named) if b and Path(b).is_file()):
        certificates += _PEM.findall(Path(bundle).read_bytes())
    for section in config.sections():
        config.remove_option(section, "cert")
        if not config.options(section):
            config.remove_section(section)
    text = io.StringIO()
    config.write(text)
    return HostTrust(certificates=tuple(dict.fromkeys(certificates)), pip_conf=text.getvalue().strip())


def install_host_trust(rootfs: Path, trust: HostTrust) -> None:
    """Add to the root file system `rootfs` the host certificates its bundle lacks (also under
    /usr/local/share/ca-certificates, so a later `update-ca-certificates` keeps them) and the
    host's pip configuration as /etc/pip.conf."""
    bundle = rootfs / CA_BUNDLE
    known = set(_PEM.findall(bundle.read_bytes())) if bundle.is_file() else set()
    extra = [c for c in dict.fromkeys(trust.certificates) if c not in known]
    if extra:
        local = rootfs / "usr/local/share/ca-certificates"
        local.mkdir(parents=True, exist_ok=True)
        for number, certificate in enumerate(extra):
            (local / f"stacx-host-{number}.crt").write_bytes(certificate + b"\n")
        bundle.parent.mkdir(parents=True, exist_ok=True)
        with bundle.open("ab") as out:
            out.write(b"".join(c + b"\n" for c in extra))
    if trust.pip_conf:
        (rootfs / "etc/pip.conf").write_text(trust.pip_conf + "\n")


def _trust_of(image: str) -> str:
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{TRUST_LABEL}"}}}}', image],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.stdout.strip()


def build(names: list[str] | None = None, *, say: Callable[[str], None] = print, force: bool = False) -> None:
    """Build the named local images (default: all of `STAND_INS`), skipping present ones (the
    Debian stand-in and its python child are rebuilt when this machine's trust changed)."""
    trust = host_trust().digest
    follow = False  # the python stand-in is rebuilt after the Debian one it starts FROM
    for name in names or list(STAND_INS):
        if name not in STAND_INS:
            raise InfraError(f"{name!r} is not an image stacx builds; choose from {', '.join(STAND_INS)}")
        present = image_exists(name)
        stale = present and name in (STAND_IN_DEBIAN, STAND_IN_PYTHON) and _trust_of(name) != trust
        if present and not (force or stale or (follow and name == STAND_IN_PYTHON)):
            say(f"{name}: present")
            continue
        if stale:
            say(f"{name}: built for another CA bundle or pip configuration than this machine's: rebuilding")
        follow = follow or name == STAND_IN_DEBIAN
        say(f"{name}: building ({STAND_INS[name]}; log {_log()})")
        if name == STAND_IN_DEBIAN:
            build_stand_in()
        elif name == STAND_IN_PYTHON:
            _require(STAND_IN_DEBIAN, say)
            _docker_build(name, {"Dockerfile": _PYTHON_DOCKERFILE})
        else:
            build_tools(say=say)
        say(f"{name}: built")


def _require(name: str, say: Callable[[str], None]) -> None:
    if not image_exists(name):
        build([name], say=say)


def _log() -> Path:
    return paths.logs_dir() / "harbor-images.log"


def build_stand_in() -> None:
    """`stacx/base:debian-bookworm`: debootstrap minbase, apt pointed at this machine's mirror."""
    mirror = debian_mirror()
    tools.ensure(["debootstrap"], say=lambda line: print(f"[stacx infra] {line}"))
    with tempfile.TemporaryDirectory(prefix="stacx-standin-", dir=paths.stacx_home()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", "--include=ca-certificates", SUITE, str(rootfs), mirror]
        _run(cmd, "debootstrap")
        (rootfs / "etc/apt/sources.list").write_text(f"deb {mirror} {SUITE} main\n")
        trust = host_trust()
        install_host_trust(rootfs, trust)
        _run(
            ["rm", "-rf", str(rootfs / "var/cache/apt/archives"), str(rootfs / "var/lib/apt/lists")], "clean"
        )
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
        changes = [
            'CMD ["/bin/bash"]',
            "ENV LANG=C.UTF-8",
            # uv (rustls) and requests (certifi) read these instead of the system bundle
            f"ENV SSL_CERT_FILE=/{CA_BUNDLE} REQUESTS_CA_BUNDLE=/{CA_BUNDLE}",
            "LABEL org.stacx.image=stand-in",
            f"LABEL {TRUST_LABEL}={trust.digest}",
        ]
        cmd = ["docker", "import", *(x for c in changes for x in ("--change", c)), "-", STAND_IN_DEBIAN]
        proc = subprocess.run(cmd, stdin=tar.stdout, capture_output=True, text=True)
        tar.wait()
        if proc.returncode != 0 or tar.returncode != 0:
            raise InfraError(f"`docker import` of {STAND_IN_DEBIAN} failed: {proc.stderr.strip()}")


def build_tools(*, say: Callable[[str], None] = print) -> None:
    """`stacx/harbor-tools`: wheels and uv fetched here with pip, python3/curl bundled in a build."""
    _require(STAND_IN_DEBIAN, say)
    with tempfile.TemporaryDirectory(prefix="stacx-tools-", dir=paths.stacx_home()) as tmp:
        context = Path(tmp)
        _pip_download(["--only-binary=:all:", "-d", str(context / "wheels"), *TOOLS_REQUIREMENTS])
        _pip_download(
            ["--only-binary=:all:", "--no-deps", "--platform", "musllinux_1_1_x86_64", "-d", tmp, "uv"]
        )
        _unpack_uv(next(context.glob("uv-*.whl")), context)
        _docker_build(TOOLS_IMAGE, {"Dockerfile": _TOOLS_DOCKERFILE, "bundle.sh": _BUNDLE_SH}, context)


def _pip_download(args: list[str]) -> None:
    import sys

    _run([sys.executable, "-m", "pip", "download", "--quiet", *args], "pip download")


def _unpack_uv(wheel: Path, context: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            name = member.rsplit("/", 1)[-1]
            if "/scripts/" in member and name in ("uv", "uvx"):
                (context / name).write_bytes(archive.read(member))
    if not (context / "uv").is_file() or not (context / "uvx").is_file():
        raise InfraError(f"{wheel.name} holds no uv/uvx binaries")


def _docker_build(tag: str, files: dict[str, str], context: Path | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="stacx-build-", dir=paths.stacx_home()) as tmp:
        root = context or Path(tmp)
        for name, text in files.items():
            (root / name).write_text(text)
        _run(["docker", "build", "--network", "host", "--pull=false", "-t", tag, str(root)], "docker build")


def _run(cmd: list[str], what: str) -> None:
    with open(_log(), "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(_log().read_text(errors="replace").splitlines()[-15:])
        raise InfraError(f"{what} failed (exit {proc.returncode}); last lines of {_log()}:\n{tail}")
