"""Pieces shared by the real backends: the in-sandbox command lines and output capping."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import BackendError, FileOperationFailed, SandboxFileNotFound
from sandbox.models import ExecResult
from sandbox.protocols import HostCapacity

NOT_FOUND_EXIT = 44
"""Exit status of READ_FILE_SCRIPT when the file is missing."""

TOOL_FAILURE_EXITS = (1, 2)
"""Exit statuses of `mkdir`, `tar` and `cat` failing on their own (their stderr says why)."""

READ_FILE_SCRIPT = f'[ -f "$1" ] || exit {NOT_FOUND_EXIT}; exec cat -- "$1"'
READ_DIR_SCRIPT = f'[ -d "$1" ] || exit {NOT_FOUND_EXIT}; exec tar -c -C "$1" .'
WRITE_ARCHIVE_SCRIPT = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -m -C "$1" -f -'
OOM_EVENTS_SCRIPT = (
    "cat /sys/fs/cgroup/memory.events 2>/dev/null"
    " || cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null || true"
)
RESET_SCRIPT = r"""me=$$
_left() {  # processes but init, its keep-alive `sleep 86400`, this shell and its children
  n=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    if [ "$p" = 1 ] || [ "$p" = "$me" ]; then continue; fi
    read -r _ _ _ ppid _ < "$d/stat" 2>/dev/null || continue
    { read -r -d '' arg0; read -r -d '' arg1; } < "$d/cmdline" 2>/dev/null
    if [ "$ppid" = "$me" ] || { [ "$ppid" = 1 ] && [ "$arg0 $arg1" = "sleep 86400" ]; }; then continue; fi
    n=$((n+1))
  done
}
i=0
while :; do
  kill -9 -1 2>/dev/null  # every process this user may signal but init and this shell
  _left
  [ "$n" = 0 ] && break
  i=$((i+1))
  if [ "$i" -ge 200 ]; then echo "$n processes survive kill -9" >&2; exit 1; fi
  sleep 0.01
done
dirs=(/dev/shm) modes=()
for item in "$@"; do
  [ -d "${item#*:}" ] && dirs+=("${item#*:}") && modes+=("$item")
done
chmod -R u+rwX -- "${dirs[@]}" 2>/dev/null
find "${dirs[@]}" -mindepth 1 -delete 2>/dev/null
left=$(find "${dirs[@]}" -mindepth 1 -maxdepth 1 -print -quit)
if [ -n "$left" ]; then echo "$left is left after the wipe" >&2; exit 1; fi
for item in "${modes[@]}"; do chmod "${item%%:*}" -- "${item#*:}" || exit 1; done
ipcrm --all 2>/dev/null || true
"""
"""Return a plain sandbox to its just-started state, as its own user: kill every process but
init (which reaps them), empty the writable directories given as `MODE:PATH` arguments (and
give them back MODE) and /dev/shm, drop
System V IPC objects. Exits non-zero when anything survives."""
TIMEOUT_GRACE_S = 5.0
"""Extra time the host waits for an exec past its in-sandbox `timeout` before giving up on it."""


EXEC_SCRIPT = """bash -c "$1"
_rc=$?
_left() {
  local f s
  for f in /proc/[0-9]*/stat; do
    read -r s 2>/dev/null < "$f" || continue
    s=${s##*) }
    set -- $s
    [ "$3" = "$_group" ] && [ "$1" != Z ] || continue
    f=${f#/proc/}; f=${f%/stat}
    [ "$f" != "$$" ] && [ "$f" != "$PPID" ] && return 0
  done
  return 1
}
read -r _s < /proc/$$/stat; _s=${_s##*) }; set -- $_s; _group=$3
if _left; then
  exec {_nap}<> <(:)
  while _left; do read -t 0.05 -u "$_nap"; done
fi
exit $_rc"""
"""Runs the command (`$1`), then waits until no other process of its process group is left: an
exec lasts as long as anything it started (`cmd &`, a fork bomb) and ends with the command's exit
status. Only bash builtins run after the command starts, so a sandbox at its pids limit cannot
stall it. (`read -t` on a pipe opened read-write is a sleep that needs no process.)"""


def exec_argv(command: str, timeout_s: float) -> list[str]:
    """argv of one exec: `timeout -s KILL` leads a new process group that holds the command and
    everything it starts; `EXEC_SCRIPT` keeps the exec open while any of them runs, and at the
    deadline the whole group is killed at once (background children included: exit 137)."""
    seconds = f"{max(timeout_s, 0.01):.3f}"
    return ["timeout", "-s", "KILL", seconds, "bash", "-c", EXEC_SCRIPT, "stacx", command]


def helper_argv(script: str, *args: str) -> list[str]:
    """argv running a fixed shell script with positional arguments (never interpolated)."""
    return ["bash", "-c", script, "stacx", *args]


class OutputCap:
    """Accumulates a stream up to `limit` bytes and remembers whether more came."""

    __slots__ = ("limit", "parts", "size", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - self.size
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        if chunk:
            self.parts.append(chunk)
            self.size += len(chunk)

    def data(self) -> bytes:
        return b"".join(self.parts)

    def text(self) -> str:
        return self.data().decode("utf-8", errors="replace")


@dataclass(kw_only=True, slots=True)
class RawRun:
    """A finished in-sandbox process, bytes as produced."""

    exit_code: int
    stdout: OutputCap
    stderr: OutputCap
    duration_s: float
    host_timeout: bool = False
    """The host gave up waiting (the in-sandbox timeout did not end it)."""


def to_result(run: RawRun, timeout_s: float, *, oom_killed: bool = False) -> ExecResult:
    """ExecResult of a command run under `exec_argv`; exit 137 at the deadline means timed out."""
    at_deadline = run.duration_s >= timeout_s * 0.98 or math.isclose(run.duration_s, timeout_s)
    timed_out = run.host_timeout or (run.exit_code == 137 and at_deadline and not oom_killed)
    return ExecResult(
        exit_code=run.exit_code,
        stdout=run.stdout.text(),
        stderr=run.stderr.text(),
        stdout_truncated=run.stdout.truncated,
        stderr_truncated=run.stderr.truncated,
        timed_out=timed_out,
        oom_killed=oom_killed,
        duration_s=run.duration_s,
    )


def check_helper(run: RawRun, what: str, path: str) -> None:
    """Raise the right error when a helper script (read/write files) failed: a missing path is
    `SandboxFileNotFound`; the tool's own failure (`mkdir`, `tar`, `cat` exit 1 or 2: a file in
    the way, no permission, a full tmpfs) is the client's `FileOperationFailed`; anything else
    (the helper could not run) is the backend's."""
    if run.exit_code == NOT_FOUND_EXIT:
        raise SandboxFileNotFound(f"{path} does not exist in the sandbox (or is not a {what})")
    if run.exit_code in TOOL_FAILURE_EXITS:
        detail = run.stderr.text().strip()[-500:]
        raise FileOperationFailed(
            f"{what} {path!r} could not be used in the sandbox: {detail or f'exit {run.exit_code}'}"
        )
    if run.exit_code != 0:
        detail = run.stderr.text().strip()[-500:]
        raise BackendError(f"{what} {path!r} failed with exit {run.exit_code}: {detail}")


def downloaded(run: RawRun, what: str, path: str, max_bytes: int) -> bytes:
    """The bytes a read helper (READ_FILE_SCRIPT, READ_DIR_SCRIPT) printed, after `check_helper`;
    output cut at `max_bytes` is an error, never a silently short file."""
    check_helper(run, what, path)
    if run.stdout.truncated:
        raise BackendError(f"{path} is larger than the download limit of {max_bytes} bytes")
    return run.stdout.data()


def parse_oom_kills(text: str) -> int:
    """`oom_kill N` from cgroup v2 memory.events or v1 memory.oom_control (0 when absent)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value.strip())
    return 0


def local_pid_max() -> int | None:
    """This machine's /proc/sys/kernel/pid_max (None where it cannot be read)."""
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return None


def local_capacity() -> HostCapacity:
    """Cores, memory and pid_max of this machine."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    return HostCapacity(cpus=float(os.cpu_count() or 1), memory_mb=int(memory), pid_max=local_pid_max())
