"""Services forked from one process that has already imported torch and transformers.

On one host the inference server and the trainer each import torch and transformers: seconds of
start-up apiece, and each holds its own copy of what those imports build in memory. A run's
`Preloader` starts one process (this module's `main`) that imports them once,
before any thread exists, and then forks a service on request: the child starts its `stacx`
command at once and shares the imported pages with its siblings until it writes them
(copy-on-write), as gunicorn's `--preload` and Android's zygote do.

The preloader is started with the run's environment, so `/proc/<pid>/environ` of every forked
service names the run (`STACX_RUN_ID`) as a spawned one would. A service whose own environment sets
what libraries read at import (OpenMP, MKL, oneDNN, ATen, CUDA device selection, the interpreter's
own settings) is not forked: a fork would keep the preloader's values, so it starts as a fresh
process. The protocol is one JSON object per line: requests on the preloader's stdin, answers
(`ready`, `started`, `exited`) on its stdout.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from stacx.infra.pipeline.errors import ServiceError
from stacx.infra.services.processes import pid_alive, tail

if TYPE_CHECKING:
    from stacx.infra.pipeline.services import ServiceSpec

__all__ = ["FORKED_COMMANDS", "PRELOAD_MODULES", "ForkedProcess", "PreloadError", "Preloader", "forkable",
           "model_modules"]

PRELOAD_MODULES = (
    "torch", "transformers", "stacx.infra.cli", "stacx.rollout.inference.server", "stacx.trainer",
)
"""Imported once by the preloader; `trainer` imports the FSDP2 engine's modules."""
ENTRY = "stacx.infra.cli:main"
"""What a forked child runs with the request's arguments: the `stacx` command line."""
FORKED_COMMANDS = frozenset({"serve", "train"})
"""The `stacx` commands that import torch (the rest do not: they start as fresh processes)."""
IMPORT_TIME_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "ONEDNN_", "DNNL_", "ATEN_", "CUDA_", "HIP_",
                        "ROCR_", "NCCL_", "LD_", "PYTHON", "MALLOC_")
"""Environment read when a library is loaded: a service that sets one starts fresh."""
_KEPT = frozenset({"PYTHONUNBUFFERED"})


OPTIONAL = "--optional"
"""On the preloader's command line, before the modules it imports if they exist (a model's)."""
_MODEL_TYPE = re.compile(r"[a-z0-9_]+")
_MAIN = "import sys; from stacx.infra.pipeline.preload import main; main(sys.argv[1:])"
"""The preloader's command (not `-m`: the package's __init__ has imported this module already)."""


class PreloadError(ServiceError):
    """The preloader could not be started or answered out of turn (the service then starts as a
    fresh process)."""


def forkable(args: list[str], env: dict[str, str]) -> bool:
    """Whether `stacx <args>` with the extra `env` can be forked from the preloader."""
    if not args or args[0] not in FORKED_COMMANDS:
        return False
    return not any(k.startswith(IMPORT_TIME_PREFIXES) and k not in _KEPT for k in env)


# ------------------------------------------------------------------------------ client side


class ForkedProcess:
    """A service forked by the preloader: the part of `subprocess.Popen` a `ServiceProcess` uses.
    Its exit status comes from the preloader, which is its parent and reaps it."""

    def __init__(self, pid: int, preloader: Preloader) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._preloader = preloader

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._preloader.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


class Preloader:
    """One run's preloader process: `start()`, `spawn()` services, `close()`."""

    def __init__(self, env: dict[str, str], log_path: Path, *, modules: Iterable[str] = PRELOAD_MODULES,
                 optional: Iterable[str] = (), entry: str = ENTRY, timeout_s: float = 120.0) -> None:
        self.env = env
        self.log_path = log_path
        self.modules = tuple(modules)
        self.optional = tuple(optional)
        """Imported too where they exist (`model_modules`); a missing one is skipped."""
        self.entry = entry
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._answers: list[dict[str, Any]] = []
        self._exits: dict[int, int] = {}
        self._reader: threading.Thread | None = None
        self._ready = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Preloader:
        """Start the preloader; its imports go on while the run starts other things (the first
        `spawn` waits for them)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-c", _MAIN, self.entry, *self.modules, OPTIONAL, *self.optional]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env={**self.env, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="stacx-preload", daemon=True)
        self._reader.start()
        return self

    def takes(self, spec: ServiceSpec) -> bool:
        """Whether `spec` is forked from here: a torch-importing `stacx` command whose environment
        does not change what is read at import, while the preloader runs."""
        return spec.program is None and forkable(spec.args, spec.env) and self.alive()

    def spawn(self, args: list[str], env: dict[str, str], log_path: Path) -> ForkedProcess:
        """Fork `stacx <args>` with `env` (the whole environment), its output appended to `log_path`."""
        with self._lock:
            if not self._ready:
                self._answer("ready")
                self._ready = True
            self._send({"args": args, "env": env, "log": str(log_path), "cwd": os.getcwd()})
            return ForkedProcess(int(self._answer("started")["pid"]), self)

    def exit_status(self, pid: int) -> int | None:
        """The exit status of a forked service (Popen's convention), None while it runs. If the
        preloader itself is gone, a service that no longer exists counts as killed."""
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
        if not self.alive() and not pid_alive(pid):
            return -signal.SIGKILL
        return None

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the preloader (its services are stopped by their owners, not here)."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of requests: it exits
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def _send(self, request: dict[str, Any]) -> None:
        if not self.alive():
            raise PreloadError(f"the preloader has exited; log {self.log_path}")
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:  # it exited between the check and the write
            raise PreloadError(f"the preloader has exited ({exc}); log {self.log_path}") from exc

    def _answer(self, kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        with self._changed:
            while not self._answers:
                if not self.alive() and not (self._reader and self._reader.is_alive()):
                    raise PreloadError(f"the preloader exited before it was {kind}; log {self.log_path}:\n"
                                       f"{tail(self.log_path, 15)}")
                if time.monotonic() >= deadline:
                    raise PreloadError(f"the preloader was not {kind} within {self.timeout_s:.0f}s; "
                                       f"log {self.log_path}")
                self._changed.wait(0.2)
            answer = self._answers.pop(0)
        if answer.get("kind") != kind:
            raise PreloadError(f"the preloader answered {answer} where {kind!r} was due")
        return answer

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._on_message(json.loads(line))
        with self._changed:
            self._changed.notify_all()

    def _on_message(self, message: dict[str, Any]) -> None:
        with self._changed:
            if message.get("kind") == "exited":
                self._exits[int(message["pid"])] = int(message["status"])
            else:  # pids come again (pid_max is often 32768): a new service drops the old one's status
                self._exits.pop(int(message.get("pid", 0)), None)
                self._answers.append(message)
            self._changed.notify_all()


# ------------------------------------------------------------------------------ the preloader


def _write(out: IO[bytes], message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def _reap(out: IO[bytes]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _write(out, {"kind": "exited", "pid": pid, "status": os.waitstatus_to_exitcode(status)})


def _become_service(request: dict[str, Any], entry: Callable[[list[str]], Any]) -> None:
    """In the forked child: the service's session, files, environment and command. Never returns:
    the command's SystemExit ends the interpreter as it would end a fresh `stacx` process."""
    os.setsid()  # its own process group, as a spawned service's: stopping it stops its ranks
    # the signals as CPython sets them at start-up: SIGPIPE ignored, so a client that hangs up before
    # its answer is written is a BrokenPipeError the server handles, not the end of the server
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["stacx", *request["args"]]
    entry(list(request["args"]))
    raise SystemExit(0)


def _resolve(entry: str) -> Callable[[list[str]], Any]:
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def model_modules(model_dir: Path) -> tuple[str, ...]:
    """The transformers modules that loading the model in `model_dir` imports lazily: the Auto
    classes and its architecture's modeling file (seconds of imports in every service that loads
    it). Nothing when its config.json names no model type."""
    try:
        model_type = json.loads((model_dir / "config.json").read_text())["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    name = str(model_type).replace("-", "_")
    if not _MODEL_TYPE.fullmatch(name):
        return ()
    return ("transformers.models.auto.modeling_auto", f"transformers.models.{name}.modeling_{name}")


def serve(entry: str, modules: list[str], optional: Iterable[str] = ()) -> None:
    """The preloader's loop: import `modules`, those of `optional` that exist and `entry`
    ("module:function"), then fork one service per request, running `entry(args)`, until stdin
    ends."""
    for name in modules:
        importlib.import_module(name)
    for name in optional:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # a model type transformers names otherwise: its services import it
            print(f"stacx preload: {name} not preloaded ({exc})", file=sys.stderr, flush=True)
    run = _resolve(entry)
    # a Python thread could hold a lock (logging's, the import lock) at the fork, and the child would
    # wait for it forever; native pools (OpenBLAS's) stop and restart around a fork on their own
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate()]
        raise SystemExit(f"stacx preload: importing {', '.join(modules)} started the threads {names}; "
                         "services start as fresh processes instead")
    # what was imported stays untouched by the children's garbage collector, so their copies of
    # those pages stay shared (CPython's gc.freeze, made for pre-fork servers)
    gc.freeze()
    requests, out = sys.stdin.buffer, sys.stdout.buffer
    _write(out, {"kind": "ready", "pid": os.getpid(), "modules": modules})
    buffer = b""
    while True:
        readable, _, _ = select.select([requests], [], [], 0.2)
        _reap(out)
        if not readable:
            continue
        chunk = os.read(requests.fileno(), 65536)
        if not chunk:
            return  # the run closed its end: no more services
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _become_service(request, run)
            _write(out, {"kind": "started", "pid": pid})


def main(argv: list[str]) -> None:
    """`ENTRY MODULE... [--optional MODULE...]`: the preloader process (see `Preloader`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run stops it by closing its stdin
    modules = argv[1:]
    optional: list[str] = []
    if OPTIONAL in modules:
        at = modules.index(OPTIONAL)
        modules, optional = modules[:at], modules[at + 1:]
    serve(argv[0], modules, optional)
