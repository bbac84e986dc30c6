"""A partition in the lab is a silent link, not a crash: a cut host's process lives on and its
peer's connection attempts time out (no refusal, no reset); healed, the same peer gets through.
Needs root and `ip` (it fails, it does not skip, without them)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from stacx.infra.services.netlab import NetLab, netlab_problem

SERVE = "import socket,time;s=socket.create_server(('0.0.0.0',7000));time.sleep(60)"
CONNECT = (
    "import socket,sys\n"
    "try:\n socket.create_connection((sys.argv[1], 7000), timeout=2).close(); print('connected')\n"
    "except TimeoutError: print('timed out')\n"
    "except OSError as e: print('error', e)\n"
)


def test_a_cut_host_is_silent_and_a_healed_one_answers(tmp_path: Path) -> None:
    problem = netlab_problem()
    assert problem is None, f"cannot build the network-namespace hosts: {problem}"
    with NetLab(["server", "client"]) as lab:
        server = lab.start("server", [sys.executable, "-c", SERVE], log_path=tmp_path / "server.log")
        address = lab.hosts["server"].address

        def connect() -> str:
            return lab.run("client", [sys.executable, "-c", CONNECT, address], timeout_s=30).stdout.strip()

        deadline = time.monotonic() + 20
        while (answer := connect()) != "connected" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer == "connected"
        lab.cut("server")
        assert connect() == "timed out"
        assert server.poll() is None  # the cut host's process lives on
        lab.heal("server")
        assert connect() == "connected"
