"""`stacx tasks check`: run a task's oracle and a no-op agent, each in a fresh session, and
report both rewards (a well-formed task scores 1.0 and 0.0) with what explains a failure: the
fields that matter, the image used, warnings, per-step rewards and the tail of test.sh's output."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stacx.sandbox.errors import SandboxError
from stacx.sandbox.models import ExecResult, SessionSpec, VerifyResult
from stacx.sandbox.sessions import SessionManager
from stacx.sandbox.tasks import HarborTask, TaskStep, load_task
from stacx.sandbox.terminal import clean_text
from stacx.sandbox.trials import TrialOutcome, run_trial
from stacx.sandbox.verifier import run_oracle, timeout_source

__all__ = ["TaskCheck", "check_path", "check_task", "network_hint", "python_hint", "ran_to_assertions"]

_NETWORK = re.compile(
    r"could not resolve host|temporary failure (in name )?resolution|temporary failure resolving|"
    r"network is unreachable|name or service not known|failed to establish a new connection|"
    r"network connectivity is disabled|no solution found when resolving|failed to fetch|unable to connect",
    re.IGNORECASE,
)
_ASSERTION_FAILED = re.compile(
    r"^E\s+(assert\b|AssertionError)|^AssertionError\b|\bAssertionError:", re.MULTILINE
)
_NO_PYTHON = re.compile(r"No interpreter found for (?:Python )?(\S+?)(?: in |\s*$)", re.MULTILINE)
"""uv's words when no interpreter of the version asked for is there (and downloads are off)."""
_PYTHON_ASKED = re.compile(r"^.*\buvx?\b.*(?:\s-p\s*|--python[ =])['\"]?[\w.+-]+.*$", re.MULTILINE)
"""A test.sh line asking uv/uvx for a Python version (`uvx -p 3.12 ...`, `uv run --python 3.13`)."""
_TAIL_CHARS = 1200


def network_hint(text: str) -> str | None:
    """The first line of `text` that shows a command failing for want of network, if any."""
    return next((line.strip()[:200] for line in text.splitlines() if _NETWORK.search(line)), None)


def python_hint(output: str, test_sh: str) -> str | None:
    """One line naming the Python version test.sh asked uv for and how to provide it offline,
    when uv found none (None otherwise)."""
    missing = _NO_PYTHON.search(output)
    if missing is None:
        return None
    version = missing.group(1)
    asked = _PYTHON_ASKED.search(test_sh)
    where = f" (`{asked.group(0).strip()[:120]}`)" if asked else ""
    return (
        f"test.sh asks for Python {version}{where}, which no interpreter in the sandbox provides and "
        f"sandboxes cannot download: map a directory of Python installations with --python-dir DIR "
        f"(made where there is internet, e.g. `uv python install --install-dir DIR {version}`)"
    )


def ran_to_assertions(text: str) -> bool:
    """Whether `text` shows tests that ran and failed on their assertions (pytest's `E  assert`,
    an AssertionError): then a network-looking line elsewhere is not why the reward is low."""
    return _ASSERTION_FAILED.search(text) is not None


@dataclass(kw_only=True, slots=True)
class TaskCheck:
    """Rewards of one task under its oracle and under a no-op agent, and why they are what they are."""

    task: str
    oracle_reward: float | None = None
    noop_reward: float | None = None
    error: str | None = None
    path: str = ""
    image: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    """The parsed task.toml fields that matter (cpus, memory, timeouts, steps, internet...)."""
    warnings: list[str] = field(default_factory=list)
    oracle_steps: dict[str, float] = field(default_factory=dict)
    """Oracle reward per step (multi-step tasks)."""
    oracle_rewards: dict[str, float] = field(default_factory=dict)
    """Every named reward of the oracle run."""
    output_tail: str | None = None
    """Last lines of test.sh's output in the run whose reward parity did not expect."""
    oracle_exit_codes: dict[str, int] = field(default_factory=dict)
    """Exit status of solution/solve.sh per step where it was not 0 (the step was verified anyway)."""
    needs_python: str | None = None
    """The Python version test.sh asked for that no interpreter provides, and how to provide it."""
    needs_network: str | None = None
    """The output line showing the task failed for want of network."""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Oracle 1.0, no-op 0.0, no error."""
        return self.error is None and self.oracle_reward == 1.0 and self.noop_reward == 0.0

    def as_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self) | {"passed": self.passed}


async def _oracle(
    manager: SessionManager, session_id: str, task: HarborTask, step: TaskStep, check: TaskCheck
) -> None:
    """Run the step's solve.sh and, like Harbor's OracleAgent, record a non-zero exit and verify
    anyway (a solve.sh whose last command fails may still have solved the task)."""
    solved = await run_oracle(manager, session_id, task, step)
    if solved.ok:
        return
    check.oracle_exit_codes[step.name] = solved.exit_code
    output = clean_text(solved.stdout + solved.stderr).strip()
    hint = network_hint(output)
    state = _exit_state(solved, timeout_source("agent", task, step))
    check.warnings.append(
        f"solution/solve.sh of {step.name} {state}, verified anyway"
        + (f" (needs network: {hint})" if hint else "")
        + f": {output[-300:]!r}"
    )


def _exit_state(run: ExecResult, limit: str) -> str:
    return f"timed out ({limit})" if run.timed_out else f"exited {run.exit_code}"


async def _noop(step: TaskStep) -> None:
    return None


async def _trial(
    manager: SessionManager, task: HarborTask, check: TaskCheck, *, oracle: bool
) -> TrialOutcome:
    session = await manager.create(SessionSpec(task_dir=str(task.path)))
    check.image = session.image
    check.warnings = list(dict.fromkeys(check.warnings + session.warnings))
    try:

        async def agent(step: TaskStep) -> None:
            await _oracle(manager, session.id, task, step, check)

        return await run_trial(manager, session.id, task, agent if oracle else _noop, workdir=session.workdir)
    finally:
        await manager.close(session.id)


def _explain(check: TaskCheck, result: VerifyResult, task: HarborTask) -> None:
    output = clean_text(result.stdout + "\n" + result.stderr).strip()
    check.output_tail = output[-_TAIL_CHARS:]
    if result.timed_out:
        step = next((s for s in task.steps if s.name == result.step), task.steps[-1])
        check.warnings.append(f"test.sh timed out ({timeout_source('verifier', task, step)})")
    test_sh = task.tests_dir / "test.sh"
    check.needs_python = python_hint(output, test_sh.read_text(errors="replace") if test_sh.is_file() else "")
    hint = None if ran_to_assertions(output) or check.needs_python else network_hint(output)
    if hint:
        internet = " (it asks for internet)" if task.wants_internet else ""
        check.needs_network = f"test.sh needs network{internet}, sandboxes have none: {hint}"


async def check_task(manager: SessionManager, task: HarborTask) -> TaskCheck:
    """Oracle and no-op rewards of `task` (errors are reported in the result, not raised)."""
    started = time.monotonic()
    check = TaskCheck(
        task=task.name, path=str(task.path), fields=task.summary(), warnings=list(task.warnings)
    )
    try:
        if task.unsupported:
            check.error = f"not supported: {task.unsupported}"
            return check
        noop = await _trial(manager, task, check, oracle=False)
        check.noop_reward = noop.reward
        if noop.reward != 0.0:
            _explain(check, noop.steps[-1].result, task)
        if not task.has_solution:
            check.error = "no solution/solve.sh: the oracle cannot run"
            return check
        oracle = await _trial(manager, task, check, oracle=True)
        check.oracle_reward, check.oracle_rewards = oracle.reward, oracle.rewards
        check.oracle_steps = {s.name: s.result.reward for s in oracle.steps} if task.multi_step else {}
        if oracle.reward != 1.0:
            _explain(check, oracle.steps[-1].result, task)
    except (SandboxError, OSError) as exc:
        check.error = f"{type(exc).__name__}: {exc}"
        hint = network_hint(str(exc))
        if hint and check.needs_network is None:
            check.needs_network = f"needs network, sandboxes have none: {hint}"
    finally:
        check.duration_s = round(time.monotonic() - started, 1)
    return check


async def check_path(manager: SessionManager, directory: Path) -> TaskCheck:
    """`check_task` of the task folder `directory`; a task that does not load is a failed check."""
    try:
        task = load_task(directory)
    except (SandboxError, OSError) as exc:
        return TaskCheck(task=directory.name, path=str(directory), error=f"{type(exc).__name__}: {exc}")
    return await check_task(manager, task)
