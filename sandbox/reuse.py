"""Sandbox reuse: a closed session's sandbox, reset, serves the next session of the same shape.

Starting a container costs the engine far more than resetting one (one `docker exec` that kills
every sandbox process and empties the writable mounts), and a rollout opens a session per
episode. Only plain sandboxes qualify: a read-only image with empty tmpfs mounts as the only
writable places (a workdir seeded from the image counts only when the image's is empty), so
"reset" restores exactly the state a fresh start gives. The backend says which directories those
are (`SandboxHandle.writable`); Harbor task sandboxes (writable root file system, tool volumes)
are never reused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from stacx.sandbox.protocols import SandboxHandle, SandboxSpec

__all__ = ["Resettable", "ReusePool", "ShapeKey", "shape_key"]

ShapeKey = tuple[str, str, float, int, int, tuple[tuple[str, str], ...]]
"""(image, workdir, cpus, memory_mb, pids, env): sandboxes of one key are interchangeable (the
environment is the container's own, set when it starts)."""


@runtime_checkable
class Resettable(Protocol):
    """A backend that can return a used sandbox to its just-started state."""

    async def reset(self, handle: SandboxHandle) -> bool:
        """Kill every process of the sandbox but its init and empty its writable mounts; False
        (never an exception) when the sandbox cannot be made as good as new."""
        ...


def shape_key(spec: SandboxSpec) -> ShapeKey | None:
    """The reuse key of a sandbox, or None when it must never be reused."""
    if spec.harbor or spec.volumes:
        return None
    return (spec.image, spec.workdir, spec.cpus, spec.memory_mb, spec.pids, tuple(sorted(spec.env.items())))


@dataclass(kw_only=True, slots=True)
class _Idle:
    handle: SandboxHandle
    label_expires_at: float
    """When any reaper may remove the sandbox (its label): a session must end before it."""
    idle_since: float


@dataclass(kw_only=True, slots=True)
class ReusePool:
    """Reset sandboxes waiting for their next session, by shape; oldest first out on eviction
    (the session manager bounds how many it keeps)."""

    clock: Callable[[], float] = time.monotonic
    _idle: dict[ShapeKey, list[_Idle]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._idle.values())

    @property
    def sandbox_ids(self) -> set[str]:
        return {e.handle.session_id for entries in self._idle.values() for e in entries}

    def put(self, key: ShapeKey, handle: SandboxHandle, *, label_expires_at: float) -> None:
        entry = _Idle(handle=handle, label_expires_at=label_expires_at, idle_since=self.clock())
        self._idle.setdefault(key, []).append(entry)

    def take(self, key: ShapeKey, *, until: float) -> tuple[SandboxHandle, float] | None:
        """A sandbox of `key` whose label outlives `until` (unix time), the most recently used
        first (its pages are warmest): (handle, label expiry)."""
        entries = self._idle.get(key, [])
        for index in range(len(entries) - 1, -1, -1):
            if entries[index].label_expires_at >= until:
                entry = entries.pop(index)
                return entry.handle, entry.label_expires_at
        return None

    def pop_oldest(self) -> SandboxHandle | None:
        """Remove and return the sandbox idle the longest (to make room in the budget)."""
        candidates = [
            (e.idle_since, key, i) for key, entries in self._idle.items() for i, e in enumerate(entries)
        ]
        if not candidates:
            return None
        _, key, index = min(candidates)
        return self._idle[key].pop(index).handle

    def pop_idle(self, older_than_s: float) -> list[SandboxHandle]:
        """Remove and return the sandboxes idle for `older_than_s` or longer."""
        cutoff = self.clock() - older_than_s
        gone: list[SandboxHandle] = []
        for entries in self._idle.values():
            gone += [e.handle for e in entries if e.idle_since <= cutoff]
            entries[:] = [e for e in entries if e.idle_since > cutoff]
        return gone

    def drain(self) -> list[SandboxHandle]:
        """Remove and return every idle sandbox."""
        handles = [e.handle for entries in self._idle.values() for e in entries]
        self._idle.clear()
        return handles
