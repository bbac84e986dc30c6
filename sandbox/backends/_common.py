"""Pieces shared by the real backends: the in-sandbox command lines and output capping."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from stacx.sandbox.errors import BackendError, FileOperationFailed, LimitExceeded, SandboxFileNotFound
from stacx.sandbox.models import ExecResult
from stacx.sandbox.protocols import HostCapacity

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


EXEC_MARK_ENV = "STACX_EXEC_ID"
"""Environment variable that marks every process one exec starts (its value is unique per exec):
a process that left the exec's process group (`setsid`, a daemon's double fork) still carries it."""

LEFT_RUNNING_TAG = "\x1estacx-left-running\x1e"
"""Frames the list of an exec's processes left running, at the end of its stderr."""

MAX_LEFT_RUNNING = 32
"""At most this many processes left running are listed per exec."""

_MARKED = r"""_mark="STACX_EXEC_ID=$MARK"
_marked() {  # whether process $1 carries this exec's mark in its environment
  local _v _env
  mapfile -d '' -t _env 2>/dev/null < "/proc/$1/environ" || return 1
  for _v in "${_env[@]}"; do [ "$_v" = "$_mark" ] && return 0; done
  return 1
}
_nap() {  # sleep 50 ms without a process: `read -t` on a pipe opened read-write
  [ -n "$_napfd" ] || exec {_napfd}<> <(:)
  read -t 0.05 -u "$_napfd"
}
_kill_marked() {  # SIGKILL every marked process until none is left (a forking one included)
  local _round _n _d _p
  for _round in {1..200}; do
    _n=0
    for _d in /proc/[0-9]*; do
      _p=${_d#/proc/}
      [ "$_p" != "$$" ] && _marked "$_p" && kill -9 "$_p" 2>/dev/null && _n=$((_n+1))
    done
    [ "$_n" = 0 ] && return 0
    _nap
  done
  return 1
}
_list_marked() {  # "PID COMMAND" lines of the marked processes still running, in $_list
  local _d _p _a _c _n=0
  _list=""
  for _d in /proc/[0-9]*; do
    _p=${_d#/proc/}
    [ "$_p" != "$$" ] && _marked "$_p" || continue
    mapfile -d '' -t _a 2>/dev/null < "$_d/cmdline" || continue
    _c="${_a[*]}"
    _list+="$_p ${_c:0:200}"$'\n'
    _n=$((_n+1))
    [ "$_n" -ge MAX_LEFT ] && break
  done
}""".replace("MAX_LEFT", str(MAX_LEFT_RUNNING))

TRACKED_EXEC_SCRIPT = (
    """MARK=$3
STACX_EXEC_ID="$3" timeout -s KILL "$2" bash -c "$4" stacx "$1" <&0 &
wait $! 2>/dev/null  # no "Killed" notice of bash's on the exec's stderr
_rc=$?
"""
    + _MARKED
    + r"""
if [ "$_rc" = 137 ]; then
  _kill_marked
else
  _list_marked
  _tag=$'\x1estacx-left-running\x1e'
  [ -z "$_list" ] || printf '%s%s%s' "$_tag" "$_list" "$_tag" >&2
fi
exit $_rc"""
)
"""Leads one tracked exec: `timeout` runs `EXEC_SCRIPT` with the exec's mark (`$3`) in its
environment. An exec killed with SIGKILL (at its deadline, by the out-of-memory killer) takes
every marked process with it, those that left its process group too. An exec that ended on its
own leaves the processes that left its group running (a daemon it started on purpose, like a
tmux server) and lists them on stderr between two `LEFT_RUNNING_TAG`s."""

KILL_MARKED_SCRIPT = "MARK=$1\n" + _MARKED + "\n_kill_marked"
"""Kill every process of the exec whose mark is `$1` (the host gave up on it or was cancelled)."""

LIST_MARKED_SCRIPT = "MARK=$1\n" + _MARKED + '\n_list_marked; printf "%s" "$_list"'
"""Print the processes of the exec whose mark is `$1` that still run, one `PID COMMAND` a line."""


def tracked_exec_argv(command: str, timeout_s: float, mark: str) -> list[str]:
    """argv of one exec whose processes carry `mark` in `EXEC_MARK_ENV` (`TRACKED_EXEC_SCRIPT`):
    `exec_argv`'s process group, plus what left it, is ended when the exec is killed and listed
    when it is not."""
    seconds = f"{max(timeout_s, 0.01):.3f}"
    return ["bash", "-c", TRACKED_EXEC_SCRIPT, "stacx", command, seconds, mark, EXEC_SCRIPT]


def cut_left_running(stderr: OutputCap) -> list[str] | None:
    """Remove the `LEFT_RUNNING_TAG` list from the end of an exec's stderr and return its lines
    (empty: none left running); None when the cap cut the list off (ask with LIST_MARKED_SCRIPT)."""
    data, tag = stderr.data(), LEFT_RUNNING_TAG.encode()
    end = data.rfind(tag)
    if end < 0:
        if not stderr.truncated:
            return []
        stderr.replace(_without_partial_tag(data, tag))
        return None
    start = data.rfind(tag, 0, end)
    if start < 0:  # only the opening tag came: the cap cut the rest
        stderr.replace(data[:end])
        return None
    body = data[start + len(tag) : end].decode("utf-8", errors="replace")
    stderr.replace(data[:start] + data[end + len(tag) :])
    return parse_left_running(body)


def _without_partial_tag(data: bytes, tag: bytes) -> bytes:
    """`data` less a cut-off beginning of `tag` at its end."""
    for size in range(len(tag) - 1, 0, -1):
        if data.endswith(tag[:size]):
            return data[:-size]
    return data


def parse_left_running(text: str) -> list[str]:
    """Lines of `LIST_MARKED_SCRIPT`'s output."""
    return [line for line in text.splitlines() if line]


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

    def replace(self, data: bytes) -> None:
        """Keep `data` (a part of what was added) as the stream."""
        self.parts = [data] if data else []
        self.size = len(data)


@dataclass(kw_only=True, slots=True)
class RawRun:
    """A finished in-sandbox process, bytes as produced."""

    exit_code: int
    stdout: OutputCap
    stderr: OutputCap
    duration_s: float
    host_timeout: bool = False
    """The host gave up waiting (the in-sandbox timeout did not end it)."""


def to_result(
    run: RawRun, timeout_s: float, *, oom_killed: bool = False, left_running: list[str] | None = None
) -> ExecResult:
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
        left_running=left_running or [],
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
        raise LimitExceeded(  # a retry can never succeed: not a BackendError
            f"{path} is larger than the download limit of {max_bytes} bytes "
            "(sessions.max_file_bytes); compress or split it with an exec first"
        )
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
