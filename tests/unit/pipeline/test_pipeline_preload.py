"""Services forked from the run's preloader: real forks, a probe entry written to tmp_path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.infra.pipeline.errors import ServiceError
from stacx.infra.pipeline.preload import ForkedProcess, Preloader, PreloadError, forkable, model_modules
from stacx.infra.pipeline.services import ServiceProcess, ServiceSpec
from stacx.rollout.models import make_tiny_model

SIGNALS = ("SIGINT", "SIGTERM", "SIGPIPE", "SIGXFSZ", "SIGHUP", "SIGCHLD")
PROBE = f"SIGNALS = {SIGNALS!r}\n" + '''
import json, os, signal, socket, sys, time

def _write_to_a_closed_peer():
    """What a server sees when a client hangs up before the answer is sent."""
    mine, theirs = socket.socketpair()
    theirs.close()
    try:
        mine.send(b"HTTP/1.1 400 Bad Request")
    except BrokenPipeError:
        return "BrokenPipeError"
    finally:
        mine.close()
    return "sent"

def main(args):
    """Write what the forked service sees, then sleep, exit with a status, or wait for SIGTERM."""
    broken_pipe = _write_to_a_closed_peer()  # under SIGPIPE's default action, the end of the process
    signals = {name: repr(signal.getsignal(getattr(signal, name))) for name in SIGNALS}
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump({"args": args, "argv": sys.argv, "pid": os.getpid(), "ppid": os.getppid(),
                   "pgid": os.getpgid(0), "sid": os.getsid(0), "cwd": os.getcwd(),
                   "service_env": os.environ.get("SERVICE_ONLY"), "loaded": "json" in sys.modules,
                   "optional_loaded": "csv" in sys.modules, "broken_pipe": broken_pipe,
                   "signals": signals}, out)
    print("probe printed this", flush=True)
    if args[1] == "exit":
        raise SystemExit(int(args[2]))
    time.sleep(300)
'''


def _wait_for(path: Path) -> dict[str, object]:
    for _ in range(600):  # an upper bound against a hang, not a timing assertion
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


@pytest.fixture
def preloader(tmp_path: Path) -> Iterator[Preloader]:
    (tmp_path / "probe_entry.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
           "STACX_RUN_ID": "preload-test-run"}
    loader = Preloader(env, tmp_path / "preload.log", modules=("json",), entry="probe_entry:main").start()
    yield loader
    loader.close()


def _service(name: str, tmp_path: Path, *args: str) -> ServiceSpec:
    return ServiceSpec(name=name, args=["serve", *args], env={"PROBE_OUT": str(tmp_path / f"{name}.json"),
                                                               "SERVICE_ONLY": name})


def test_a_service_is_forked_with_its_own_env_session_and_exit_status(
    preloader: Preloader, tmp_path: Path
) -> None:
    spec = _service("trainer", tmp_path, "exit", "3")
    service = ServiceProcess(spec, tmp_path / "logs", launcher=preloader).start()
    seen = _wait_for(tmp_path / "trainer.json")
    assert seen["ppid"] == preloader.pid  # forked, not spawned by the run
    assert seen["pgid"] == seen["pid"] == seen["sid"]  # its own session: stop() signals its group
    assert seen["service_env"] == "trainer"  # the service's environment, not the preloader's
    assert seen["args"] == ["serve", "exit", "3"] and seen["argv"] == ["stacx", "serve", "exit", "3"]
    assert seen["cwd"] == os.getcwd() and seen["loaded"]
    # signals as a fresh `stacx` process has them: SIGPIPE ignored (CPython's start-up), so a client
    # that hangs up mid-answer is an error the server handles, not the end of the server
    assert seen["broken_pipe"] == "BrokenPipeError"
    show = (f"SIGNALS = {SIGNALS!r}\nimport json, signal\n"
            "print(json.dumps({n: repr(signal.getsignal(getattr(signal, n))) for n in SIGNALS}))")
    fresh = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, check=True)
    assert seen["signals"] == json.loads(fresh.stdout)
    # the run's id is in what /proc shows of the preloader, so tools that find a run's processes by
    # their environment find the forked ones too
    environ = Path(f"/proc/{preloader.pid}/environ").read_bytes().split(b"\0")
    assert b"STACX_RUN_ID=preload-test-run" in environ
    assert service.proc is not None and service.proc.wait(timeout=60) == 3
    log = service.log_path.read_text()
    assert "forked from the run's preloader" in log and "probe printed this" in log
    with pytest.raises(ServiceError, match="exited with status 3"):
        service.check_alive()


def test_stop_ends_a_forked_service_by_its_group(preloader: Preloader, tmp_path: Path) -> None:
    service = ServiceProcess(_service("inference", tmp_path, "sleep"), tmp_path, launcher=preloader).start()
    pid = int(_wait_for(tmp_path / "inference.json")["pid"])  # type: ignore[call-overload]
    assert service.alive()
    # what /proc shows of the forked service's environment is the preloader's, which names the run:
    # tools that find a run's processes by it (the test suite's leak check) find this one too
    assert b"STACX_RUN_ID=preload-test-run" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    service.stop(timeout_s=30)
    assert service.proc is not None and service.proc.returncode == -signal.SIGTERM
    assert not service.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped by the preloader


def test_closing_the_preloader_leaves_running_services_to_their_owner(
    preloader: Preloader, tmp_path: Path
) -> None:
    service = ServiceProcess(_service("trainer", tmp_path, "sleep"), tmp_path, launcher=preloader).start()
    _wait_for(tmp_path / "trainer.json")
    preloader.close()
    assert preloader.proc is not None and preloader.proc.returncode == 0
    assert service.alive()  # the run stops its services itself, in its own order
    service.stop(timeout_s=30)
    assert service.proc is not None and service.proc.poll() is not None


def test_only_torch_commands_without_import_time_settings_are_forked() -> None:
    assert forkable(["serve", "--config", "x.yaml"], {"STACX_RUN_ID": "r", "PYTHONUNBUFFERED": "1"})
    assert forkable(["train", "t.yaml"], {"OTEL_TRACES_EXPORTER": "none"})
    assert not forkable(["rollout", "r.yaml"], {})  # no torch there: nothing to share
    assert not forkable(["gateway", "--config", "g.yaml"], {})
    for read_at_import in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "ATEN_CPU_CAPABILITY", "MKL_CBWR",
                           "PYTHONHASHSEED", "LD_PRELOAD"):
        assert not forkable(["train", "t.yaml"], {read_at_import: "1"}), read_at_import


def test_a_preloader_that_cannot_start_leaves_the_service_to_a_fresh_process(tmp_path: Path) -> None:
    modules = ("no_such_module_for_stacx",)
    broken = Preloader(dict(os.environ), tmp_path / "preload.log", modules=modules).start()
    with pytest.raises(PreloadError, match="exited before it was ready"):
        broken.spawn(["train", "--help"], dict(os.environ), tmp_path / "x.log")
    assert "no_such_module_for_stacx" in (tmp_path / "preload.log").read_text()
    service = ServiceProcess(ServiceSpec(name="trainer", args=["train", "--help"], finishes=True), tmp_path,
                             launcher=_Failing(tmp_path)).start()
    assert isinstance(service.proc, subprocess.Popen)
    assert service.proc.wait(timeout=120) == 0
    assert "usage: stacx train" in service.log_path.read_text()


class _Failing:
    """A launcher whose preloader died between `takes` and `spawn`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def takes(self, spec: ServiceSpec) -> bool:
        return True

    def spawn(self, args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        raise PreloadError(f"the preloader has exited; log {self.tmp_path / 'preload.log'}")


def test_a_pid_that_comes_again_is_not_taken_for_the_earlier_service(preloader: Preloader) -> None:
    """pid_max is often 32768: in a soak a killed service's pid came back for a later one, which the
    run then took for dead (the old exit status), restarted, and left running."""
    loader = preloader
    loader._on_message({"kind": "exited", "pid": 4242, "status": -9})
    assert loader.exit_status(4242) == -9
    loader._on_message({"kind": "started", "pid": 4242})
    assert ForkedProcess(4242, loader).poll() is None  # the new service runs (the preloader is not gone)


def test_optional_modules_are_preloaded_where_they_exist_and_skipped_with_a_line(tmp_path: Path) -> None:
    (tmp_path / "probe_entry.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    loader = Preloader(env, tmp_path / "preload.log", modules=("json",),
                       optional=("no_such_model_module_for_stacx", "csv"), entry="probe_entry:main").start()
    try:
        spec = _service("trainer", tmp_path, "exit", "0")
        service = ServiceProcess(spec, tmp_path, launcher=loader).start()
        seen = _wait_for(tmp_path / "trainer.json")
        assert seen["ppid"] == loader.pid and seen["optional_loaded"]  # forked after importing csv
        assert service.proc is not None and service.proc.wait(timeout=60) == 0
    finally:
        loader.close()
    log = (tmp_path / "preload.log").read_text()
    assert "stacx preload: no_such_model_module_for_stacx not preloaded" in log


def test_model_modules_are_what_transformers_imports_to_load_the_model(tmp_path: Path) -> None:
    """Checked against transformers itself: a fresh process that loads the run's kind of model
    has imported exactly these modules, so the preloader spares its services those imports."""
    model = make_tiny_model(tmp_path / "model")
    modules = model_modules(model)
    assert modules and modules[0] == "transformers.models.auto.modeling_auto"
    probe = ("import sys, json; from transformers import AutoModelForCausalLM; "
             f"AutoModelForCausalLM.from_pretrained({str(model)!r}); "
             f"print(json.dumps([m in sys.modules for m in {list(modules)!r}]))")
    argv = [sys.executable, "-c", probe]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True] * len(modules)
    (tmp_path / "bad").mkdir()
    assert model_modules(tmp_path / "bad") == ()  # no config.json
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "../evil"}))
    assert model_modules(tmp_path / "bad") == ()
