"""The installed docker-py still keeps an exec's response where `stacx.sandbox.library_patches`
reads it (else a fast command's output that came with the headers would be lost)."""

from __future__ import annotations

from stacx.sandbox.library_patches import check_docker


def test_docker_py_keeps_the_exec_response_on_its_socket() -> None:
    check_docker()
