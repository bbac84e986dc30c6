"""The local trace backend: Jaeger v2, built once from source with Go, run on loopback.

`up()` builds `github.com/jaegertracing/jaeger/cmd/jaeger` once per machine into
`$STACX_HOME/jaeger/<version>/jaeger` (an empty Go module, `go get -tool` then `go build`: `go install
...@version` is refused because Jaeger's module has replace directives; ~6 minutes on 2 cores), writes
a config that binds every listener to 127.0.0.1 (OTLP gRPC 4317 and HTTP 4318, the query API on
16686) and keeps spans in memory, starts it and waits for its health check. The Go build has no
UI bundle (its own page is a placeholder, and no released UI package is on npm): `stacx trace` and
the trace pages of `stacx view` (`/traces/<trace id>`) read the query API and draw the trace.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from stacx.infra import paths
from stacx.infra.services import tools
from stacx.infra.services.errors import InfraError
from stacx.infra.services.processes import pid_alive, port_open, read_pid, require_free_port, stop_pid, tail

VERSION = "1.76.0"
MODULE = "github.com/jaegertracing/jaeger"
PACKAGE = f"{MODULE}/cmd/jaeger"
HOST = "127.0.0.1"
MIN_GO = (1, 21)
"""Oldest Go that can build it (newer toolchains are fetched by Go itself, GOTOOLCHAIN=auto)."""


def _port(env: str, default: int) -> int:
    return int(os.environ.get(env, str(default)))


@dataclass(kw_only=True, slots=True)
class JaegerConfig:
    """How the local trace backend is run."""

    otlp_grpc_port: int = field(default_factory=lambda: _port("STACX_OTLP_GRPC_PORT", 4317))
    """OTLP/gRPC receiver on 127.0.0.1 (env STACX_OTLP_GRPC_PORT)."""
    otlp_http_port: int = field(default_factory=lambda: _port("STACX_OTLP_HTTP_PORT", 4318))
    """OTLP/HTTP receiver on 127.0.0.1 (env STACX_OTLP_HTTP_PORT)."""
    query_port: int = field(default_factory=lambda: _port("STACX_JAEGER_QUERY_PORT", 16686))
    """Query API (`/api/traces`) on 127.0.0.1 (env STACX_JAEGER_QUERY_PORT)."""
    query_grpc_port: int = field(default_factory=lambda: _port("STACX_JAEGER_QUERY_GRPC_PORT", 16685))
    """Query gRPC API on 127.0.0.1 (env STACX_JAEGER_QUERY_GRPC_PORT)."""
    health_port: int = field(default_factory=lambda: _port("STACX_JAEGER_HEALTH_PORT", 13133))
    """Health check on 127.0.0.1 (env STACX_JAEGER_HEALTH_PORT)."""
    max_traces: int = 100_000
    """Traces kept in memory (the oldest are dropped past it)."""
    start_timeout_s: float = 60.0
    """How long `up` waits for the health check."""
    build_timeout_s: float = 3600.0
    """How long the one-time Go build may take."""

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://{HOST}:{self.otlp_http_port}"

    @property
    def query_url(self) -> str:
        return f"http://{HOST}:{self.query_port}"


def home() -> Path:
    return paths.stacx_home() / "jaeger" / VERSION


def binary() -> Path:
    return home() / "jaeger"


def log_file() -> Path:
    return paths.logs_dir() / "jaeger.log"


def pid_file() -> Path:
    return paths.run_dir() / "jaeger.pid"


# -- build -----------------------------------------------------------------------------------------


def ensure_binary(config: JaegerConfig) -> Path:
    """Build Jaeger once per machine; the path of the binary."""
    target = binary()
    if target.is_file():
        return target
    tools.ensure(["go"], say=lambda line: print(f"[stacx infra] {line}"))
    go = _go_with_version()
    build = home() / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    print(f"[stacx infra] building Jaeger {VERSION} with Go (once per machine, several minutes)", flush=True)
    started = time.monotonic()
    partial = home() / "jaeger.partial"
    steps = [
        [go, "mod", "init", "stacx.local/jaeger-build"],
        [go, "get", "-tool", f"{PACKAGE}@v{VERSION}"],
        [go, "build", "-trimpath", "-o", str(partial), PACKAGE],
    ]
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    for cmd in steps:
        _run_step(cmd, build, env, config.build_timeout_s)
    partial.rename(target)
    shutil.rmtree(build, ignore_errors=True)
    print(f"[stacx infra] built {target} in {time.monotonic() - started:.0f}s", flush=True)
    return target


def _go_with_version() -> str:
    go = shutil.which("go")
    if go is None:
        raise InfraError("`go` is not on PATH; install Go 1.21+ (`apt-get install golang-go`)")
    out = subprocess.run([go, "version"], capture_output=True, text=True).stdout
    match = re.search(r"go(\d+)\.(\d+)", out)
    if not match or (int(match.group(1)), int(match.group(2))) < MIN_GO:
        raise InfraError(
            f"Jaeger needs Go {MIN_GO[0]}.{MIN_GO[1]}+ to build, `{go} version` says {out.strip()!r}; "
            "install a newer Go and put it first on PATH, then rerun `stacx infra up`"
        )
    return go


def _run_step(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"`{' '.join(cmd)}` did not finish within {timeout_s:.0f}s") from exc
    if proc.returncode == 0:
        return
    output = (proc.stdout + proc.stderr).strip()
    last = "\n".join(output.splitlines()[-15:])
    hint = ""
    if re.search(r"dial tcp|no such host|connection refused|i/o timeout|proxyconnect", output):
        hint = "Go could not download the Jaeger module: check the network or set GOPROXY. "
    raise InfraError(f"{hint}`{' '.join(cmd)}` failed while building Jaeger {VERSION}:\n{last}")


# -- configuration ---------------------------------------------------------------------------------


def write_config(config: JaegerConfig) -> Path:
    """All-in-one pipeline (OTLP in, memory storage, query API), every listener on 127.0.0.1."""
    text = f"""\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: info
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: {HOST}:{config.health_port}
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: {HOST}:{config.query_port}
    grpc:
      endpoint: {HOST}:{config.query_grpc_port}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {config.max_traces}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {HOST}:{config.otlp_grpc_port}
      http:
        endpoint: {HOST}:{config.otlp_http_port}
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""
    path = home() / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- lifecycle -------------------------------------------------------------------------------------


def running_pid() -> int | None:
    return read_pid(pid_file())


def answers(config: JaegerConfig, timeout_s: float = 2.0) -> bool:
    """True when the query API answers (`/api/services`)."""
    import httpx

    try:
        return httpx.get(f"{config.query_url}/api/services", timeout=timeout_s).is_success
    except httpx.HTTPError:
        return False


def up(config: JaegerConfig) -> str:
    """Build once, start unless ours already runs; a one-line status."""
    pid = running_pid()
    if pid is not None and answers(config):
        return (
            f"Jaeger already running: OTLP {config.otlp_http_endpoint}, query {config.query_url} (pid {pid})"
        )
    if pid is None:
        for port, what, env in _ports(config):
            require_free_port(HOST, port, what, env)
        exe = ensure_binary(config)
        pid = _spawn(exe, write_config(config))
    _wait_ready(config, pid)
    return (
        f"Jaeger {VERSION} started: OTLP grpc {HOST}:{config.otlp_grpc_port} "
        f"http {config.otlp_http_endpoint}, "
        f"query {config.query_url} (pid {pid}, log {log_file()})"
    )


def _ports(config: JaegerConfig) -> list[tuple[int, str, str]]:
    return [
        (config.otlp_grpc_port, "Jaeger's OTLP/gRPC receiver", "STACX_OTLP_GRPC_PORT"),
        (config.otlp_http_port, "Jaeger's OTLP/HTTP receiver", "STACX_OTLP_HTTP_PORT"),
        (config.query_port, "Jaeger's query API", "STACX_JAEGER_QUERY_PORT"),
        (config.query_grpc_port, "Jaeger's query gRPC API", "STACX_JAEGER_QUERY_GRPC_PORT"),
        (config.health_port, "Jaeger's health check", "STACX_JAEGER_HEALTH_PORT"),
    ]


def _spawn(exe: Path, config_path: Path) -> int:
    with open(log_file(), "ab") as log:
        proc = subprocess.Popen(
            [str(exe), "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file().write_text(str(proc.pid))
    return proc.pid


def _wait_ready(config: JaegerConfig, pid: int) -> None:
    deadline = time.monotonic() + config.start_timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            pid_file().unlink(missing_ok=True)
            raise InfraError(
                f"Jaeger exited during start-up; last lines of {log_file()}:\n{tail(log_file())}"
            )
        if port_open(HOST, config.query_port) and answers(config):
            return
        time.sleep(0.3)
    raise InfraError(
        f"Jaeger did not answer within {config.start_timeout_s:.0f}s; last lines of {log_file()}:\n"
        f"{tail(log_file())}"
    )


def down() -> str:
    pid = running_pid()
    if pid is None:
        pid_file().unlink(missing_ok=True)
        return "Jaeger: not running (nothing started by stacx)"
    stop_pid(pid, timeout_s=20)
    pid_file().unlink(missing_ok=True)
    return f"Jaeger: stopped pid {pid}"


def status(config: JaegerConfig) -> tuple[bool, str]:
    pid = running_pid()
    if pid is None:
        built = "built" if binary().is_file() else "not built yet"
        return False, f"Jaeger {VERSION}: not running ({built}; `stacx infra up` starts it, log {log_file()})"
    healthy = answers(config)
    state = "answering" if healthy else "NOT answering"
    return healthy, (
        f"Jaeger {VERSION}: pid {pid}, {state}; OTLP grpc {HOST}:{config.otlp_grpc_port} "
        f"http {config.otlp_http_endpoint}, query API {config.query_url}/api/traces, log {log_file()}"
    )
