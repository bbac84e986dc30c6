"""Local-service helpers that need no running service."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from stacx.infra.services import kafka, sandbox_image
from stacx.infra.services.errors import InfraError
from stacx.infra.services.processes import require_free_port


def test_busy_port_names_port_and_process() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(InfraError) as info:
            require_free_port("127.0.0.1", port, "the Kafka broker", "STACX_KAFKA_PORT")
    message = str(info.value)
    assert f"port {port}" in message
    assert f"pid {os.getpid()}" in message
    assert "STACX_KAFKA_PORT" in message


def test_server_properties_listen_on_loopback_only(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STACX_HOME", str(tmp_path))
    config = kafka.KafkaConfig(port=19092, controller_port=19093)
    props = dict(
        line.split("=", 1) for line in kafka.write_server_properties(config).read_text().splitlines()
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["process.roles"] == "broker,controller"
    assert props["log.dirs"].startswith(str(tmp_path))


def test_kafka_version_comes_from_the_pom() -> None:
    assert kafka.kafka_version().startswith("4.")


def test_missing_java_is_a_clear_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(InfraError, match="Java 17"):
        kafka.java_binary()


def test_maven_unreachable_message_says_how_to_fix() -> None:
    message = kafka._maven_failure("[ERROR] Could not transfer artifact ... UnknownHostException")
    assert "could not reach Maven Central" in message


@pytest.mark.parametrize(
    "text",
    [
        "deb http://mirror.example/debian bookworm main\n",
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n",
    ],
)
def test_debian_mirror_is_read_from_apt_sources(tmp_path: Path, text: str) -> None:
    source = tmp_path / "sources"
    source.write_text(text)
    assert sandbox_image._mirror_in(source) == "http://mirror.example/debian"


def test_debian_mirror_env_override(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STACX_DEBIAN_MIRROR", "http://mirror.example/debian")
    assert sandbox_image.debian_mirror() == "http://mirror.example/debian"


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STACX_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(InfraError, match="`mvn` .*Maven.*apt-get install -y maven"):
        kafka.ensure_jars()


def test_broker_dying_during_start_shows_its_log(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    import time

    monkeypatch.setenv("STACX_HOME", str(tmp_path))
    kafka.log_file().write_text("line 1\nERROR Exiting Kafka due to fatal exception\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(InfraError) as info:
        kafka.wait_ready(kafka.KafkaConfig(port=1, controller_port=2), dead.pid, time.monotonic())
    assert "exited during start-up" in str(info.value)
    assert "Exiting Kafka due to fatal exception" in str(info.value)


def test_debootstrap_failure_names_the_mirror_and_log(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STACX_HOME", str(tmp_path))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "debootstrap").write_text("#!/bin/sh\necho 'E: Failed getting release file' ; exit 1\n")
    (fake / "debootstrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    with pytest.raises(InfraError) as info:
        sandbox_image._debootstrap(tmp_path / "rootfs", "http://mirror.example/debian")
    message = str(info.value)
    assert "mirror.example" in message and "STACX_DEBIAN_MIRROR" in message
    assert "Failed getting release file" in message


def test_cluster_ids_never_start_with_a_dash_the_storage_tool_would_read_as_an_option(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import base64
    import uuid

    dash_first = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))  # encodes to "-AAA..."
    draws = iter([dash_first, uuid.UUID(int=1)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    cluster_id = kafka.new_cluster_id()
    assert cluster_id == base64.urlsafe_b64encode(uuid.UUID(int=1).bytes).rstrip(b"=").decode()
    assert len(cluster_id) == 22 and not cluster_id.startswith("-")
