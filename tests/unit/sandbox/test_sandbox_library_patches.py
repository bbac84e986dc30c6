"""The installed docker-py still keeps an exec's response where `stacx.sandbox.library_patches`
reads it (else a fast command's output that came with the headers would be lost), and a docker-py
that moved it is refused by name."""

from __future__ import annotations

import inspect

import pytest

from stacx.sandbox import library_patches
from stacx.sandbox.library_patches import LibraryMoved, check_docker


def test_docker_py_keeps_the_exec_response_on_its_socket() -> None:
    from docker.api.client import APIClient

    source = inspect.getsource(APIClient._get_raw_response_socket)
    assert "sock._response = response" in source and "raw._fp.fp" in source
    assert check_docker() is None


def test_a_docker_py_that_moved_the_response_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(library_patches.inspect, "getsource", lambda _: "def moved(): pass\n")
    with pytest.raises(LibraryMoved, match="update stacx.sandbox.library_patches.exec_reader"):
        check_docker()
