"""Exec plumbing shared by the docker and process backends."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from stacx.sandbox.backends._common import (
    EXEC_SCRIPT,
    KILL_MARKED_SCRIPT,
    LEFT_RUNNING_TAG,
    NOT_FOUND_EXIT,
    OutputCap,
    RawRun,
    cut_left_running,
    downloaded,
    exec_argv,
    helper_argv,
    parse_oom_kills,
    to_result,
    tracked_exec_argv,
)
from stacx.sandbox.errors import BackendError, FileOperationFailed, LimitExceeded, SandboxFileNotFound


def test_exec_argv_kills_the_process_group_at_the_timeout() -> None:
    argv = exec_argv("echo hi", 2.5)
    assert argv[:4] == ["timeout", "-s", "KILL", "2.500"]
    assert argv[4:] == ["bash", "-c", EXEC_SCRIPT, "stacx", "echo hi"]


def _run_here(command: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """The exec argv run on this host (the same bash and coreutils a sandbox has)."""
    return subprocess.run(
        exec_argv(command, timeout_s), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_exec_keeps_the_command_exit_status_and_output() -> None:
    done = _run_here("echo out; echo err >&2; exit 3", 30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_exec_waits_for_background_children_that_finish_in_time() -> None:
    done = _run_here("(sleep 0.3; echo late) & echo early", 60)
    assert (done.returncode, done.stdout) == (0, "early\nlate\n")


def test_background_children_are_killed_with_the_exec_at_the_deadline() -> None:
    done = _run_here("sleep 300 & echo $!", 1)
    assert done.returncode == -9  # SIGKILLed with its group at the deadline, not exit 0
    child = int(done.stdout.split()[0])
    for _ in range(100):  # the group's SIGKILL is delivered asynchronously; 300 s if it never is
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)


def _run_tracked(command: str, timeout_s: float, mark: str) -> subprocess.CompletedProcess[str]:
    argv = tracked_exec_argv(command, timeout_s, mark)
    return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)


def _gone_soon(pid: int) -> bool:
    for _ in range(100):  # SIGKILL is delivered asynchronously
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_killed_exec_takes_what_left_its_process_group_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "escape.pid"
    command = f"setsid -f sh -c 'echo $$ > {pid_file}; exec sleep 300' </dev/null >/dev/null 2>&1; sleep 300"
    done = _run_tracked(command, 1, uuid.uuid4().hex)
    assert done.returncode == 137 and LEFT_RUNNING_TAG not in done.stderr
    assert _gone_soon(int(pid_file.read_text()))


def test_a_finished_exec_leaves_a_daemon_running_and_lists_it(tmp_path: Path) -> None:
    command = "setsid -f sleep 301 </dev/null >/dev/null 2>&1; echo out; echo err >&2"
    mark = uuid.uuid4().hex  # unique: the kill below reaches every process on this host carrying it
    done = _run_tracked(command, 30, mark)
    stderr = OutputCap(1 << 16)
    stderr.add(done.stderr.encode())
    [line] = cut_left_running(stderr)
    pid, command_line = line.split(" ", 1)
    try:
        assert (done.returncode, done.stdout, stderr.text()) == (0, "out\n", "err\n")
        assert command_line == "sleep 301"
        assert _alive(int(pid))
    finally:
        subprocess.run(helper_argv(KILL_MARKED_SCRIPT, mark), check=True, timeout=60)
    assert _gone_soon(int(pid))


def _cap(data: bytes, limit: int = 1000) -> OutputCap:
    cap = OutputCap(limit)
    cap.add(data)
    return cap


def test_cut_left_running_takes_the_list_off_the_end_of_stderr() -> None:
    tag = LEFT_RUNNING_TAG.encode()
    stderr = _cap(b"warning\n" + tag + b"12 tmux new-session -d\n13 sleep 9\n" + tag)
    assert cut_left_running(stderr) == ["12 tmux new-session -d", "13 sleep 9"]
    assert stderr.data() == b"warning\n"
    plain = _cap(b"nothing left\n")
    assert cut_left_running(plain) == [] and plain.data() == b"nothing left\n"


def test_cut_left_running_asks_again_when_the_cap_cut_the_list() -> None:
    tag = LEFT_RUNNING_TAG.encode()
    opened = _cap(b"x" * 5 + tag + b"12 tmux", limit=5 + len(tag) + 7)
    opened.add(b" more" + tag)
    assert cut_left_running(opened) is None and opened.data() == b"xxxxx"
    half_tag = _cap(b"x" * 5 + tag, limit=8)
    assert cut_left_running(half_tag) is None and half_tag.data() == b"xxxxx"
    lost = _cap(b"x" * 20, limit=8)
    assert cut_left_running(lost) is None and lost.data() == b"x" * 8


def test_output_cap_truncates_and_flags() -> None:
    cap = OutputCap(5)
    cap.add(b"abc")
    cap.add(b"defg")
    cap.add(b"h")
    assert cap.data() == b"abcde"
    assert cap.truncated


def test_output_cap_under_limit_is_not_truncated() -> None:
    cap = OutputCap(10)
    cap.add("é".encode())
    assert cap.text() == "é" and not cap.truncated


def _run(exit_code: int, duration_s: float, host_timeout: bool = False) -> RawRun:
    return RawRun(
        exit_code=exit_code,
        stdout=OutputCap(10),
        stderr=OutputCap(10),
        duration_s=duration_s,
        host_timeout=host_timeout,
    )


def test_kill_at_the_deadline_is_a_timeout() -> None:
    assert to_result(_run(137, 2.01), 2.0).timed_out


def test_early_kill_is_not_a_timeout() -> None:
    result = to_result(_run(137, 0.3), 2.0, oom_killed=True)
    assert not result.timed_out and result.oom_killed


def test_host_timeout_is_a_timeout() -> None:
    assert to_result(_run(137, 9.0, host_timeout=True), 2.0).timed_out


def test_parse_oom_kills_reads_cgroup_v1_and_v2() -> None:
    assert parse_oom_kills("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n") == 2
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n") == 5
    assert parse_oom_kills("") == 0


def _read_run(exit_code: int, output: bytes, limit: int = 10) -> RawRun:
    stdout, stderr = OutputCap(limit), OutputCap(100)
    stdout.add(output)
    stderr.add(b"tar: boom")
    return RawRun(exit_code=exit_code, stdout=stdout, stderr=stderr, duration_s=0.1)


def test_downloaded_returns_the_helper_output() -> None:
    assert downloaded(_read_run(0, b"data"), "file", "f.txt", 10) == b"data"


def test_downloaded_missing_path_is_file_not_found() -> None:
    with pytest.raises(SandboxFileNotFound, match="not a directory"):
        downloaded(_read_run(NOT_FOUND_EXIT, b""), "directory", "out", 10)


def test_a_tool_failing_in_the_sandbox_is_the_clients_error_with_its_stderr() -> None:
    with pytest.raises(FileOperationFailed, match="tar: boom") as caught:
        downloaded(_read_run(2, b""), "directory", "out", 10)
    assert caught.value.status == 409 and not caught.value.retriable


def test_a_helper_that_could_not_run_is_the_backends_error() -> None:
    with pytest.raises(BackendError, match="exit 126"):
        downloaded(_read_run(126, b""), "directory", "out", 10)


def test_downloaded_over_the_limit_is_an_error_not_a_short_file() -> None:
    """Too large is permanent (a retry reads the same file): not a retriable BackendError."""
    with pytest.raises(LimitExceeded, match="download limit of 10 bytes") as caught:
        downloaded(_read_run(0, b"x" * 11), "file", "big.bin", 10)
    assert not caught.value.retriable
