"""A memory cgroup a test creates, puts its service processes in, reads and removes again."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


class MemoryCgroup:
    """`limit_bytes` of memory for the processes started in it (cgroup v1 or v2)."""

    def __init__(self, limit_bytes: int) -> None:
        self.v1 = (V1_ROOT / "memory.limit_in_bytes").exists()
        root = V1_ROOT if self.v1 else V2_ROOT
        self.path = root / f"stacx-test-{uuid.uuid4().hex[:10]}"
        try:
            self.path.mkdir()
            (self.path / ("memory.limit_in_bytes" if self.v1 else "memory.max")).write_text(str(limit_bytes))
        except OSError as exc:
            pytest.fail(
                f"cannot create a memory cgroup under {root} ({exc}); run the test as a user "
                "who may (root in the dev container)",
                pytrace=False,
            )
        self.limit_bytes = limit_bytes

    def enter(self) -> None:
        """Move the calling process in (a `preexec_fn`: the child joins before it execs)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        text = (self.path / ("memory.oom_control" if self.v1 else "memory.events")).read_text()
        counts = [int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")]
        return counts[0] if counts else 0

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        path = self.path / name
        return int(path.read_text()) if path.exists() else 0

    def remove(self) -> None:
        """Delete the group (its processes must have ended)."""
        try:
            self.path.rmdir()
        except OSError as exc:
            print(f"memory cgroup {self.path} not removed: {exc}")
