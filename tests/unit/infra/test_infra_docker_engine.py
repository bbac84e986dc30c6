"""The Docker engine helpers when the engine is wedged (a `docker info` that never returns)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stacx.infra.services import docker_engine
from stacx.infra.services.processes import pid_alive

STACX = str(Path(sys.executable).with_name("stacx"))


def _fake_docker(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "docker"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def wedged_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`docker` on PATH hangs like a wedged engine; STACX_HOME is private to the test."""
    _fake_docker(tmp_path / "bin", "exec sleep 600")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("STACX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(docker_engine, "PROBE_TIMEOUT_S", 0.5)
    return tmp_path


def test_probe_tells_wedged_from_down(wedged_docker: Path) -> None:
    assert docker_engine.probe().state == "wedged"
    _fake_docker(wedged_docker / "bin", "exit 1")
    assert docker_engine.probe().state == "down"
    _fake_docker(wedged_docker / "bin", "echo 20.10.24")
    assert docker_engine.probe() == docker_engine.EngineState("answers", "20.10.24")


def test_status_says_wedged_and_how_to_fix(wedged_docker: Path) -> None:
    healthy, line = docker_engine.status()
    assert not healthy
    assert "not answering within" in line and "wedged?" in line and "restart dockerd" in line


def test_up_restarts_a_wedged_dockerd_it_started(wedged_docker: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: E501
    stand_in = subprocess.Popen(["sleep", "600"], start_new_session=True)  # "our" wedged dockerd
    docker_engine.pid_file().parent.mkdir(parents=True, exist_ok=True)
    docker_engine.pid_file().write_text(str(stand_in.pid))
    spawned: list[bool] = []
    monkeypatch.setattr(docker_engine, "_check_can_manage", lambda: None)
    monkeypatch.setattr(docker_engine.tools, "ensure", lambda *a, **k: [])
    monkeypatch.setattr(docker_engine, "_spawn", lambda: spawned.append(True) or 4242)
    monkeypatch.setattr(docker_engine, "_wait_ready", lambda pid: None)
    try:
        assert "Docker engine started (dockerd pid 4242" in docker_engine.up()
        stand_in.wait(timeout=40)
        assert not pid_alive(stand_in.pid)
        assert spawned == [True]
    finally:
        if stand_in.poll() is None:
            stand_in.kill()


def test_up_refuses_to_touch_a_wedged_engine_it_did_not_start(wedged_docker: Path) -> None:
    with pytest.raises(docker_engine.InfraError, match="stacx did not start it: restart it yourself"):
        docker_engine.up()


def test_infra_status_cli_reports_a_wedged_engine_without_a_traceback(wedged_docker: Path) -> None:
    env = {**os.environ, "STACX_KAFKA": "127.0.0.1:1"}  # no broker either: status must still answer
    proc = subprocess.run([STACX, "infra", "status"], capture_output=True, text=True, timeout=120, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "Docker engine not answering within 10s (wedged?" in output
    assert "Traceback" not in output
