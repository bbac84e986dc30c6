"""`ScaffoldRunner`: one black-box scaffold process per episode, always ended and cleaned up.

The process runs next to the sandbox (on the engine's machine) in its own session (process
group), with the episode spec as a JSON file and its output in a log file. Outcomes:

- exit 0 and a JSON object in the result file: the episode goes on to the verifier;
- a non-zero exit: `ScaffoldCrashed` (status FAILED, with the log's tail);
- exit 0 without a readable JSON object: `ScaffoldOutputError` (FAILED, "malformed output");
- still running at the episode's deadline: the caller's timeout cancels `run`, and the whole
  process group is killed before the cancellation goes on (status TIMED_OUT).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacx.rollout.blackbox.adapter import DRIVERS, EpisodeSpec, ExternalScaffold
from stacx.rollout.blackbox.venvs import ensure_python
from stacx.rollout.errors import EnvironmentStepError, EpisodeError

__all__ = [
    "ScaffoldCrashed",
    "ScaffoldOutcome",
    "ScaffoldOutputError",
    "ScaffoldRunner",
    "gateway_endpoint",
]

log = logging.getLogger(__name__)

_LOG_TAIL = 1500
_KILL_GRACE_S = 3.0


class ScaffoldCrashed(EpisodeError):
    """The scaffold process exited with a non-zero status."""


class ScaffoldOutputError(EpisodeError):
    """The scaffold process finished but its result is not a JSON object."""


@dataclass(kw_only=True, slots=True)
class ScaffoldOutcome:
    result: dict[str, Any] = field(default_factory=dict)
    """The driver's result JSON (exit_status, num_steps, ...)."""
    log_tail: str = ""


class ScaffoldRunner:
    """Runs `adapter`'s driver for one episode at a time (many episodes may run at once)."""

    def __init__(self, adapter: ExternalScaffold, *, workdir: str | None = None) -> None:
        self.adapter = adapter
        self.workdir = workdir
        self._python: str | None = None
        self._lock = asyncio.Lock()

    async def prepare(self) -> str:
        """The scaffold's interpreter, its environment installed on first use."""
        async with self._lock:
            if self._python is None:
                self._python = await asyncio.to_thread(ensure_python, self.adapter)
        return self._python

    async def run(self, spec: EpisodeSpec) -> ScaffoldOutcome:
        python = await self.prepare()
        with tempfile.TemporaryDirectory(prefix=f"stacx-{self.adapter.name}-", dir=self.workdir) as tmp:
            spec_path, log_path = Path(tmp) / "episode.json", Path(tmp) / "scaffold.log"
            spec.result_path = str(Path(tmp) / "result.json")
            spec.write(spec_path)
            try:
                code = await self._run_process(self.adapter.argv(python, spec_path), spec_path, log_path)
            except asyncio.CancelledError:
                log.warning(
                    "scaffold %s of episode %s stopped; its log ends: %s",
                    self.adapter.name,
                    spec.episode_id,
                    _tail(log_path),
                )
                raise
            tail = _tail(log_path)
            if code != 0:
                raise ScaffoldCrashed(f"scaffold {self.adapter.name!r} exited with {code}: {tail}")
            return ScaffoldOutcome(result=_result(Path(spec.result_path), tail), log_tail=tail)

    async def _run_process(self, argv: list[str], spec_path: Path, log_path: Path) -> int:
        env = {
            **os.environ,
            **self.adapter.env,
            "STACX_EPISODE": str(spec_path),
            "PYTHONPATH": str(DRIVERS),  # the drivers' shared helper, and nothing of ours
            "PYTHONUNBUFFERED": "1",
        }
        with open(log_path, "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                return await proc.wait()
            finally:
                await _end(proc)


async def _end(proc: asyncio.subprocess.Process) -> None:
    """End what is left of the process group (the driver and anything it started)."""
    _signal_group(proc.pid, signal.SIGTERM)
    if proc.returncode is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)
    _signal_group(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        await proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-_LOG_TAIL:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


def _result(path: Path, tail: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScaffoldOutputError(
            f"malformed scaffold output ({type(exc).__name__}: {exc}); log: {tail}"
        ) from exc
    if not isinstance(value, dict):
        raise ScaffoldOutputError(
            f"malformed scaffold output: result is {type(value).__name__}, not an object"
        )
    return value


def gateway_endpoint(env: object) -> tuple[str, str]:
    """(gateway URL, bearer token) of a sandbox session, for a process that runs commands in it."""
    endpoint = getattr(env, "endpoint", None)
    if endpoint is None:
        raise EnvironmentStepError(f"{type(env).__name__} does not say which gateway serves it")
    url, token = endpoint()
    return str(url), str(token or "")
