"""Sandbox backends behind `stacx.sandbox.protocols.SandboxBackend`: docker, process (bubblewrap), fake."""

from __future__ import annotations

from stacx.sandbox.backends.docker import DockerBackend
from stacx.sandbox.backends.fake import FakeBackend
from stacx.sandbox.backends.process import ProcessBackend
from stacx.sandbox.errors import InvalidSpec
from stacx.sandbox.protocols import SandboxBackend

__all__ = ["BACKENDS", "DockerBackend", "FakeBackend", "ProcessBackend", "build_backend"]

BACKENDS = ("docker", "process")


def build_backend(name: str) -> SandboxBackend:
    """A backend with its default config, by name (`docker` or `process`)."""
    if name == "docker":
        return DockerBackend()
    if name == "process":
        return ProcessBackend()
    raise InvalidSpec(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
