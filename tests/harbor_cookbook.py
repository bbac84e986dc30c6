"""Where the official Harbor cookbook recipes (test fixtures, not copied into the repo) live:
`../shared/harbor-cookbook` beside the repository root (or beside the local checkout it was cloned
from), or $STACX_HARBOR_COOKBOOK."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _origin_checkout() -> Path | None:
    """The checkout this one was cloned from, when its `origin` is a folder on this machine (a
    fresh clone in /tmp, as CI makes one): its `shared/` neighbour has the fixtures."""
    try:
        url = subprocess.run(["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not url or ("://" in url and not url.startswith("file://")):
        return None  # no origin, or one on a server
    path = Path(url.removeprefix("file://"))
    return path if path.is_dir() else None


def _find() -> Path:
    if os.environ.get("STACX_HARBOR_COOKBOOK"):
        return Path(os.environ["STACX_HARBOR_COOKBOOK"])
    beside = REPO.parent / "shared" / "harbor-cookbook"
    origin = _origin_checkout()
    if not beside.is_dir() and origin is not None:
        return origin.resolve().parent / "shared" / "harbor-cookbook"
    return beside


COOKBOOK = _find()
SINGLE_CONTAINER = ["dns-blacklisting", "multi-reward", "multi-step", "simple-task", "skills"]
"""Recipes that need one container (no GUI, no Windows): they must pass oracle/no-op parity."""
MULTI_CONTAINER = ["mcp-tools", "multi-container", "simulated-user"]
"""Recipes with environment/docker-compose.yaml: refused as not supported yet."""


def cookbook() -> Path:
    """The cookbook folder; fails the test with the fix when it is missing."""
    if not (COOKBOOK / "simple-task" / "task.toml").is_file():
        pytest.fail(
            f"the Harbor cookbook fixtures are missing at {COOKBOOK}: put the harbor-cookbook "
            "recipes (harbor_cookbook/recipes/*) there or set STACX_HARBOR_COOKBOOK",
            pytrace=False,
        )
    return COOKBOOK
