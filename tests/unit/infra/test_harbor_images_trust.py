"""The local stand-in base images trust what the host trusts: the host CA bundle's extra
certificates (a TLS-intercepting proxy's) and the host's pip configuration go into the image."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.infra.services import harbor_images
from stacx.infra.services.harbor_images import HostTrust, host_trust, install_host_trust


def _pem(name: str) -> bytes:
    return f"-----BEGIN CERTIFICATE-----\n{name}\n-----END CERTIFICATE-----".encode()


@pytest.fixture
def no_host_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the files a test names count (not this machine's /etc)."""
    monkeypatch.setattr(harbor_images, "HOST_CA_BUNDLES", ())
    monkeypatch.setattr(harbor_images, "PIP_CONFIGS", ())


def test_host_trust_reads_the_bundle_and_merges_pip_config_and_variables(
    tmp_path: Path, no_host_files: None
) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(_pem("DEBIAN-ROOT") + b"\n" + _pem("PROXY-CA") + b"\n")
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nindex-url = https://mirror.corp/simple\ncert = /host/only/ca.pem\n")
    env = {"SSL_CERT_FILE": str(bundle), "PIP_CONFIG_FILE": str(pip_conf), "PIP_TRUSTED_HOST": "mirror.corp"}
    trust = host_trust(env)
    assert trust.certificates == (_pem("DEBIAN-ROOT"), _pem("PROXY-CA"))
    assert "index-url = https://mirror.corp/simple" in trust.pip_conf
    assert "trusted-host = mirror.corp" in trust.pip_conf
    assert "cert" not in trust.pip_conf.replace("trusted-host", "")  # a host path means nothing in an image
    assert trust.digest != HostTrust().digest


def test_a_bundle_named_only_in_pip_config_counts_and_an_empty_pip_config_is_none(
    tmp_path: Path, no_host_files: None
) -> None:
    pip_bundle = tmp_path / "pip-ca.pem"
    pip_bundle.write_bytes(_pem("PIP-ONLY-CA") + b"\n")
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {pip_bundle}\n")
    trust = host_trust({"PIP_CONFIG_FILE": str(pip_conf)})
    assert trust.certificates == (_pem("PIP-ONLY-CA"),)
    assert trust.pip_conf == ""  # only `cert` was set: nothing for the image's pip.conf


def test_install_host_trust_adds_the_missing_certificates_and_pip_conf(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc/ssl/certs").mkdir(parents=True)
    (rootfs / "etc/ssl/certs/ca-certificates.crt").write_bytes(_pem("DEBIAN-ROOT") + b"\n")
    trust = HostTrust(
        certificates=(_pem("DEBIAN-ROOT"), _pem("PROXY-CA")),
        pip_conf="[global]\nindex-url = https://m/simple",
    )
    install_host_trust(rootfs, trust)
    bundle = (rootfs / "etc/ssl/certs/ca-certificates.crt").read_bytes()
    assert bundle.count(b"BEGIN CERTIFICATE") == 2 and _pem("PROXY-CA") in bundle
    kept = list((rootfs / "usr/local/share/ca-certificates").iterdir())  # survives update-ca-certificates
    assert [p.read_bytes().strip() for p in kept] == [_pem("PROXY-CA")]
    assert (rootfs / "etc/pip.conf").read_text() == "[global]\nindex-url = https://m/simple\n"


def test_the_stand_in_build_installs_the_host_trust_and_labels_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build_stand_in` with debootstrap and `docker import` stood in for: what goes into the
    imported root file system and the image's settings."""
    import subprocess
    import tarfile

    trust = HostTrust(certificates=(_pem("PROXY-CA"),), pip_conf="[global]\nindex-url = https://m/simple")
    imported: dict[str, object] = {}

    def debootstrap(cmd: list[str], what: str) -> None:
        if what == "debootstrap":
            rootfs = Path(cmd[-2])
            (rootfs / "etc/ssl/certs").mkdir(parents=True)
            (rootfs / "etc/ssl/certs/ca-certificates.crt").write_bytes(_pem("DEBIAN-ROOT") + b"\n")
            (rootfs / "etc/apt").mkdir(parents=True)

    def docker_import(cmd: list[str], stdin: object, **_: object) -> subprocess.CompletedProcess[str]:
        data = stdin.read()  # type: ignore[attr-defined]
        with tarfile.open(fileobj=__import__("io").BytesIO(data)) as archive:
            imported["bundle"] = archive.extractfile("./etc/ssl/certs/ca-certificates.crt").read()  # type: ignore[union-attr]
            imported["pip"] = archive.extractfile("./etc/pip.conf").read()  # type: ignore[union-attr]
        imported["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("STACX_HOME", str(tmp_path))
    monkeypatch.setattr(harbor_images, "debian_mirror", lambda: "http://deb.example/debian")
    monkeypatch.setattr(harbor_images.tools, "ensure", lambda *a, **k: None)
    monkeypatch.setattr(harbor_images, "host_trust", lambda: trust)
    monkeypatch.setattr(harbor_images, "_run", debootstrap)
    monkeypatch.setattr(harbor_images.subprocess, "run", docker_import)
    harbor_images.build_stand_in()
    assert _pem("PROXY-CA") in imported["bundle"]  # type: ignore[operator]
    assert imported["pip"] == b"[global]\nindex-url = https://m/simple\n"
    cmd = " ".join(imported["cmd"])  # type: ignore[arg-type]
    assert f"LABEL org.stacx.host-trust={trust.digest}" in cmd
    assert "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in cmd
