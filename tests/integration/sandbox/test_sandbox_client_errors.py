"""What a client gets wrong comes back as a 4xx with the error's type and a message that says
what to change, on the real engine: never a 502 (the gateway's own failure) and never a 200 with
exit 126 (an exec that never started); a lifetime above the gateway's cap is said in the session's
warnings."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.backends.docker import LABEL_OWNER
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.testing import serve_gateway

TOKEN = "client-errors-token"
MAX_LIFETIME_S = 600.0


@pytest.fixture(scope="module")
def url(sandbox_image: str, docker_client: Any) -> Iterator[str]:
    owner = f"test-client-errors-{uuid.uuid4().hex[:8]}"
    config = SessionManager.Config(owner=owner, default_image=sandbox_image, max_lifetime_s=MAX_LIFETIME_S)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config) as base:
        yield base
    left = docker_client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    assert left == [], f"leaked containers: {left}"


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as c:
        yield c


@pytest.fixture
def session(http: httpx.Client) -> Iterator[dict[str, Any]]:
    created = http.post("/v1/sessions", json={"lifetime_s": 3600})
    assert created.status_code == 201, created.text
    info = created.json()
    put = http.put(f"/v1/sessions/{info['id']}/files", params={"path": "/workspace/f"}, content=b"x")
    assert put.status_code == 200, put.text
    yield info
    assert http.delete(f"/v1/sessions/{info['id']}").status_code == 204


def _error(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert error["message"] and error["type"]
    return dict(error)


def test_a_lifetime_above_the_cap_is_said_in_the_warnings(session: dict[str, Any]) -> None:
    assert session["expires_at"] - session["created_at"] <= MAX_LIFETIME_S + 1
    assert any("lifetime_s 3600 is above this gateway's maximum (600 s)" in w for w in session["warnings"]), (
        session["warnings"]
    )


def test_an_exec_in_a_workdir_that_is_a_file_is_a_400_not_exit_126(
    http: httpx.Client, session: dict[str, Any]
) -> None:
    for workdir in ("/workspace/f", "/workspace/not-here"):
        run = http.post(f"/v1/sessions/{session['id']}/exec", json={"command": "pwd", "workdir": workdir})
        assert run.status_code == 400, run.text
        error = _error(run)
        assert error["type"] == "PathRejected" and workdir in error["message"], error


@pytest.mark.parametrize(
    "body",
    [
        {"command": "echo hi", "env": {"": "x"}},
        {"command": "echo hi", "env": {"A=B": "x"}},
        {"command": "echo hi", "env": {"A": "x\u0000y"}},
        {"command": "echo a\u0000b"},
    ],
)
def test_an_environment_or_command_no_process_can_have_is_a_422(
    http: httpx.Client, session: dict[str, Any], body: dict[str, Any]
) -> None:
    run = http.post(f"/v1/sessions/{session['id']}/exec", json=body)
    assert run.status_code == 422, run.text
    assert "NUL" in run.text or "'='" in run.text


def _tar(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = 1
        archive.addfile(info, io.BytesIO(b"1"))
    return buffer.getvalue()


def test_a_write_where_a_file_is_in_the_way_is_a_409_not_a_502(
    http: httpx.Client, session: dict[str, Any]
) -> None:
    sid = session["id"]
    attempts = [
        http.put(f"/v1/sessions/{sid}/files", params={"path": "/workspace/f/x"}, content=b"hi"),
        http.put(f"/v1/sessions/{sid}/files", params={"path": "/tmp"}, content=b"hi"),
        http.put(f"/v1/sessions/{sid}/archive", params={"path": "/workspace/f"}, content=_tar("a")),
    ]
    for response in attempts:
        assert response.status_code == 409, response.text
        error = _error(response)
        assert error["type"] == "FileOperationFailed" and not error["retriable"], error
        assert "File exists" in error["message"] or "Not a directory" in error["message"], error
