"""Where the official Harbor cookbook recipes (test fixtures, not copied into the repo) live:
`../shared/harbor-cookbook` beside the repository root, or $STACX_HARBOR_COOKBOOK."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

COOKBOOK = Path(
    os.environ.get("STACX_HARBOR_COOKBOOK")
    or Path(__file__).resolve().parents[1].parent / "shared" / "harbor-cookbook"
)
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
