"""Docker exec stream decoding, without an engine: output that arrived with the HTTP headers
(and so sits in the HTTP layer's buffer) must not be lost."""

from __future__ import annotations

import socket
import struct
from types import SimpleNamespace

from stacx.sandbox.backends._common import OutputCap
from stacx.sandbox.backends.docker import _read_frames
from stacx.sandbox.library_patches import exec_reader


def _frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


def test_output_buffered_with_the_headers_is_read() -> None:
    ours, engine = socket.socketpair()
    with ours, engine:
        engine.sendall(b"HTTP/1.1 101 UPGRADED\r\n\r\n" + _frame(1, b"fast\n") + _frame(2, b"err\n"))
        engine.shutdown(socket.SHUT_WR)
        buffered = ours.makefile("rb")
        assert buffered.readline() == b"HTTP/1.1 101 UPGRADED\r\n"  # what the HTTP layer does
        assert buffered.readline() == b"\r\n"
        sock = SimpleNamespace(
            _response=SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(fp=buffered)))
        )
        out, err = OutputCap(100), OutputCap(100)
        _read_frames(exec_reader(sock, ours), out, err)
    assert (out.data(), err.data()) == (b"fast\n", b"err\n")


def test_frames_split_across_reads_are_reassembled() -> None:
    data = _frame(1, b"a" * 10) + _frame(2, b"b" * 3) + _frame(1, b"c")
    chunks = [data[i : i + 3] for i in range(0, len(data), 3)] + [b""]
    out, err = OutputCap(100), OutputCap(100)
    _read_frames(lambda _n: chunks.pop(0), out, err)
    assert (out.data(), err.data()) == (b"a" * 10 + b"c", b"bbb")
