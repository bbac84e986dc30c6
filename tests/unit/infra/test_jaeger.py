"""The local trace backend's set-up: every listener on loopback, its state under STACX_HOME, and a
clear status line when it is not running (the build and the start: tests/e2e/test_tracing_e2e.py
and `stacx infra up`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stacx.infra.services import jaeger, stack


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STACX_HOME", str(tmp_path))
    return tmp_path


def test_every_listener_of_the_config_is_on_loopback(home: Path) -> None:
    config = jaeger.JaegerConfig(otlp_grpc_port=14317, otlp_http_port=14318, query_port=16000)
    text = jaeger.write_config(config).read_text()
    endpoints = re.findall(r"endpoint: (\S+)", text)
    assert len(endpoints) == 5 and all(e.startswith("127.0.0.1:") for e in endpoints), endpoints
    assert {"127.0.0.1:14317", "127.0.0.1:14318", "127.0.0.1:16000"} <= set(endpoints)
    assert "memory:" in text and "metrics:\n      level: none" in text
    assert jaeger.binary() == home / "jaeger" / jaeger.VERSION / "jaeger"


def test_status_says_how_to_start_it_when_it_is_not_running(home: Path) -> None:
    healthy, line = jaeger.status(jaeger.JaegerConfig())
    assert not healthy
    assert "not running (not built yet; `stacx infra up` starts it" in line


def test_the_stack_shows_it_unless_told_to_leave_it_out(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stack.StackConfig().tracing_backend
    monkeypatch.setenv("STACX_TRACE_BACKEND", "0")
    assert not stack.StackConfig().tracing_backend
