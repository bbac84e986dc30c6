"""Virtual environments of black-box scaffolds, made on first use under the project's cache.

Each adapter's requirements go into `<STACX_HOME>/scaffolds/<name>-<hash>` (STACX_HOME defaults to
~/.cache/stacx), created with an interpreter that meets the adapter's minimum Python, so a
scaffold never touches the engine's own environment and a fresh machine builds it by itself.
A file lock keeps concurrent workers from installing the same environment twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from stacx.rollout.blackbox.adapter import ExternalScaffold
from stacx.rollout.errors import ConfigError, RolloutError

__all__ = ["ScaffoldInstallError", "ensure_python", "find_interpreter", "scaffold_home"]

_READY = ".stacx-ready"


class ScaffoldInstallError(RolloutError):
    """A scaffold's virtual environment could not be made."""


def scaffold_home() -> Path:
    return Path(os.environ.get("STACX_HOME") or "~/.cache/stacx").expanduser() / "scaffolds"


def _version(python: str) -> tuple[int, int]:
    out = subprocess.run(
        [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=30
    )
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_interpreter(minimum: str) -> str:
    """A Python >= `minimum` ("3.12"): ours, one on PATH, or one under ~/.pyenv/versions."""
    want = tuple(int(x) for x in minimum.split("."))
    if sys.version_info[:2] >= want:
        return sys.executable
    candidates = [shutil.which(f"python3.{m}") for m in range(want[1], want[1] + 4)]
    pyenv = Path("~/.pyenv/versions").expanduser()
    if pyenv.is_dir():
        candidates += [str(p) for p in sorted(pyenv.glob("3.*/bin/python3"))]
    for candidate in filter(None, candidates):
        try:
            if _version(candidate) >= want:
                return candidate
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
    raise ConfigError(f"no Python >= {minimum} found (PATH or ~/.pyenv/versions); install one")


def _venv_dir(adapter: ExternalScaffold) -> Path:
    key = hashlib.sha256("\n".join([adapter.python, *adapter.requirements]).encode()).hexdigest()[:12]
    return scaffold_home() / f"{adapter.name}-{key}"


def ensure_python(adapter: ExternalScaffold, *, timeout_s: float = 1800.0) -> str:
    """The interpreter to run `adapter`'s driver with, installing its environment if needed."""
    if not adapter.requirements:
        return sys.executable
    venv = _venv_dir(adapter)
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / _READY).is_file():
            _install(adapter, venv, timeout_s)
    return str(python)


def _install(adapter: ExternalScaffold, venv: Path, timeout_s: float) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    base = find_interpreter(adapter.python) if adapter.python else sys.executable
    steps = [
        [base, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        + list(adapter.requirements),
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise ScaffoldInstallError(
                f"scaffold {adapter.name!r}: {step[:3]} took over {timeout_s:g} s"
            ) from exc
        if done.returncode != 0:
            raise ScaffoldInstallError(
                f"scaffold {adapter.name!r}: {' '.join(step[:4])} failed:\n{done.stderr[-2000:]}"
            )
    (venv / _READY).write_text("\n".join(adapter.requirements) + "\n")
