"""Local ranks never outlive their launcher: interrupted (Ctrl-C, SIGTERM) or killed with -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

LAUNCHER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from stacx.trainer.distributed import spawn

    def rank(out):
        Path(out, str(os.getpid())).write_text("up")
        while True:
            time.sleep(1)

    if __name__ == "__main__":
        try:
            spawn(rank, 2, sys.argv[1])
        except KeyboardInterrupt:
            print("launcher interrupted", flush=True)
            sys.exit(130)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"


def _start(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    script, out = tmp_path / "launch.py", tmp_path / "ranks"
    script.write_text(LAUNCHER)
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(out.iterdir())) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    return proc, [int(p.name) for p in out.iterdir()]


def _wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(180)
def test_interrupting_the_launcher_stops_its_ranks(tmp_path: Path) -> None:
    proc, ranks = _start(tmp_path)
    proc.send_signal(signal.SIGINT)  # the launcher alone, as `kill -INT <pid>` would
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "launcher interrupted" in out
    assert _wait_gone(ranks, timeout_s=1.0) == []  # stopped before spawn() returned


@pytest.mark.timeout(180)
def test_ranks_die_with_a_launcher_killed_by_sigkill(tmp_path: Path) -> None:
    proc, ranks = _start(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    assert _wait_gone(ranks) == [], "ranks outlived a launcher killed with -9"



@pytest.mark.timeout(180)
def test_a_rank_killed_alone_stops_the_others_with_one_line_not_a_traceback(tmp_path: Path) -> None:
    launcher = LAUNCHER.replace("    except KeyboardInterrupt:", textwrap.indent(textwrap.dedent("""\
        except RankError as exc:
            print(f"launcher: {exc}", flush=True)
            sys.exit(1)
        except KeyboardInterrupt:"""), "    "))
    launcher = launcher.replace("from stacx.trainer.distributed import spawn",
                                "from stacx.trainer.distributed import spawn\n"
                                "from stacx.trainer.errors import RankError")
    script, out = tmp_path / "launch.py", tmp_path / "ranks"
    script.write_text(launcher)
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(out.iterdir())) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    ranks = sorted(int(p.name) for p in out.iterdir())
    os.kill(ranks[0], signal.SIGKILL)  # one rank, as the OOM killer would
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert "terminated with signal SIGKILL; the other ranks were stopped" in stdout, (stdout, stderr)
    assert "Traceback" not in stderr
    assert _wait_gone(ranks) == []


FINISHING = textwrap.dedent(
    """
    import atexit, os, sys
    from pathlib import Path
    from stacx.trainer.ranks import spawn

    class AbortsAtTeardown:
        '''A native object a library still holds when the interpreter is torn down, whose
        destructor aborts there (as a joinable C++ thread's does).'''
        def __del__(self):
            os.abort()

    def rank(out):
        atexit.register(lambda: Path(out, f"flushed-{os.getpid()}").write_text("spans"))
        sys.modules[__name__].held = AbortsAtTeardown()

    if __name__ == "__main__":
        spawn(rank, 2, sys.argv[1])
        print("ranks ended cleanly", flush=True)
    """
)


def test_a_rank_whose_work_is_done_ends_before_the_teardown_and_after_its_exit_handlers(
    tmp_path: Path,
) -> None:
    """A finished rank runs the exit handlers its work registered (tracing's span flush), then
    ends with status 0 before the interpreter's teardown, where a library's native object could
    still abort the process (SIGABRT) after a clean run."""
    script, out = tmp_path / "finish.py", tmp_path / "ranks"
    script.write_text(FINISHING)
    out.mkdir()
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "ranks ended cleanly" in done.stdout, done.stdout + done.stderr
    assert sorted(p.read_text() for p in out.iterdir()) == ["spans", "spans"]
