"""Every place the sandbox reaches into docker-py where it offers no public way, in one module.

docker-py's `exec_start(socket=True)` returns the exec's raw connection with no public reader:

- `exec_socket(sock)`: the plain socket under it (on some transports docker-py hands back a
  `SocketIO` wrapper whose socket is `_sock`);
- `exec_reader(sock, raw)`: a read function through the HTTP layer's buffered reader, which may
  already hold output that arrived with the response headers (a fast command's whole output):
  docker-py keeps the response on the socket as `_response` (`APIClient._get_raw_response_socket`),
  and urllib3's response reads through `raw._fp.fp`. Reading the bare socket would lose that output.

`check_docker()` says whether the installed docker-py still keeps the response there (tested in
`tests/unit/sandbox/test_sandbox_library_patches.py`); the reader falls back to the bare socket.
"""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["LibraryMoved", "check_docker", "exec_reader", "exec_socket"]


class LibraryMoved(RuntimeError):
    """The installed docker-py no longer has what this module relies on."""


def exec_socket(sock: Any) -> socket.socket:
    """The plain socket of an `exec_start(socket=True)` result."""
    raw: socket.socket = getattr(sock, "_sock", sock)
    return raw


def exec_reader(sock: Any, raw: socket.socket) -> Callable[[int], bytes]:
    """Read function of an exec stream: the HTTP layer's buffered reader when docker-py kept the
    response on the socket, else the bare socket's `recv`."""
    try:
        buffered = sock._response.raw._fp.fp
    except AttributeError:
        return raw.recv
    return buffered.read1 if hasattr(buffered, "read1") else raw.recv


def check_docker() -> None:
    """LibraryMoved when docker-py no longer keeps the exec response on its socket."""
    from docker.api.client import APIClient

    source = inspect.getsource(APIClient._get_raw_response_socket)
    if "sock._response = response" not in source or "raw._fp.fp" not in source:
        raise LibraryMoved("docker-py's APIClient._get_raw_response_socket no longer keeps the "
                           "response on the socket: update stacx.sandbox.library_patches.exec_reader")
