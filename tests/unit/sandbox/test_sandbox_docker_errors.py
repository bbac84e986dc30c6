"""How the Docker backend reads the engine's errors, without an engine: docker-py's `APIError`s are
`requests` exceptions too, so the specific ones must be told apart before "no answer"."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest
import requests

from stacx.sandbox.backends.docker import DockerBackend
from stacx.sandbox.errors import BackendError, BaseImageMissing
from stacx.sandbox.protocols import SandboxSpec


class _Api:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def remove_container(self, *_: Any, **__: Any) -> None:
        raise self.error


class _Containers:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def create(self, **_: Any) -> None:
        raise self.error


def _backend(error: Exception) -> DockerBackend:
    backend = DockerBackend.__new__(DockerBackend)  # no engine: only the error handling runs
    backend.config = DockerBackend.Config()
    backend._ncpu = 2.0
    backend._client = type("Client", (), {"api": _Api(error), "containers": _Containers(error)})()
    return backend


def _response(status: int) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    return response


def test_a_removal_already_in_progress_is_not_an_error() -> None:
    busy = docker.errors.APIError(
        "409", response=_response(409), explanation="removal of container x is already in progress"
    )
    _backend(busy)._remove("c" * 64)  # no exception: someone else is removing it


def test_other_engine_errors_and_silence_say_which_they_are() -> None:
    refused = docker.errors.APIError("409", response=_response(409), explanation="conflict")
    with pytest.raises(BackendError, match="failed: .*conflict"):
        _backend(refused)._remove("c" * 64)
    with pytest.raises(BackendError, match="no answer"):
        _backend(requests.exceptions.ConnectionError("refused"))._remove("c" * 64)


def test_a_missing_image_is_named_as_such_not_as_no_answer() -> None:
    spec = SandboxSpec(
        session_id="s",
        owner="o",
        instance="i",
        image="nope:1",
        workdir="/w",
        cpus=1.0,
        memory_mb=64,
        pids=16,
        expires_at=0.0,
    )
    missing = docker.errors.ImageNotFound("404", response=_response(404), explanation="no such image")
    with pytest.raises(BaseImageMissing, match="nope:1"):
        _backend(missing)._start(spec)
