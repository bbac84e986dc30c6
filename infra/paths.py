"""Where STACX keeps machine-wide state: caches, service data, pids and logs.

Everything lives under `STACX_HOME` (default `~/.cache/stacx`), outside any clone, so that a
fresh clone reuses the installed jars, images and environments.
"""

from __future__ import annotations

import os
from pathlib import Path


def stacx_home() -> Path:
    return Path(os.environ.get("STACX_HOME", Path.home() / ".cache" / "stacx")).expanduser()


def run_dir() -> Path:
    """pid files of the services `stacx infra up` started."""
    return _ensure(stacx_home() / "run")


def logs_dir() -> Path:
    return _ensure(stacx_home() / "logs")


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
