"""Sandbox backends behind `sandbox.protocols.SandboxBackend`: docker, process (bubblewrap), fake."""

from __future__ import annotations

from sandbox.backends.docker import DockerBackend
from sandbox.backends.fake import FakeBackend
from sandbox.backends.process import ProcessBackend
from sandbox.errors import InvalidSpec
from sandbox.protocols import SandboxBackend

__all__ = ["BACKENDS", "DockerBackend", "FakeBackend", "ProcessBackend", "build_backend"]

BACKENDS = ("docker", "process")


def build_backend(name: str) -> SandboxBackend:
    """A backend with its default config, by name (`docker` or `process`)."""
    if name == "docker":
        return DockerBackend()
    if name == "process":
        return ProcessBackend()
    raise InvalidSpec(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
