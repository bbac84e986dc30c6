"""Names of the pipeline runs tests create: every one starts with this test session's prefix, so
the session sweep (tests/conftest.py) deletes exactly the runs this session made and nothing a
user or another session runs on the same broker."""

from __future__ import annotations

import uuid

SESSION_PREFIX = f"pytest{uuid.uuid4().hex[:6]}-"
"""Prefix of every run id this test process creates (fresh per process: a pytest started by a
test has its own)."""


def run_name(stem: str) -> str:
    """A fresh run name (`pipeline.name`, replay name, run id) for a test: the session prefix,
    `stem`, and a random tail."""
    return f"{SESSION_PREFIX}{stem}-{uuid.uuid4().hex[:6]}"
