"""`stacx tasks check`: run a task's oracle and a no-op agent, each in a fresh session, and
report both rewards (a well-formed task scores 1.0 and 0.0)."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.errors import SandboxError
from sandbox.models import SessionSpec
from sandbox.sessions import SessionManager
from sandbox.tasks import HarborTask
from sandbox.verifier import run_oracle

__all__ = ["TaskCheck", "check_task"]


@dataclass(kw_only=True, slots=True)
class TaskCheck:
    """Rewards of one task under its oracle and under a no-op agent."""

    task: str
    oracle_reward: float | None = None
    noop_reward: float | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        """Oracle 1.0, no-op 0.0, no error."""
        return self.error is None and self.oracle_reward == 1.0 and self.noop_reward == 0.0


async def _reward(manager: SessionManager, task: HarborTask, *, oracle: bool) -> float:
    session = await manager.create(SessionSpec(task_dir=str(task.path)))
    try:
        if oracle:
            solved = await run_oracle(manager, session.id, task)
            if not solved.ok:
                raise SandboxError(
                    f"solution/solve.sh exited {solved.exit_code}: {solved.stderr.strip()[-300:]}"
                )
        return (await manager.verify(session.id, task)).reward
    finally:
        await manager.close(session.id)


async def check_task(manager: SessionManager, task: HarborTask) -> TaskCheck:
    """Oracle and no-op rewards of `task` (errors are reported in the result, not raised)."""
    check = TaskCheck(task=task.name)
    try:
        check.noop_reward = await _reward(manager, task, oracle=False)
        if task.has_solution:
            check.oracle_reward = await _reward(manager, task, oracle=True)
        else:
            check.error = "no solution/solve.sh: the oracle cannot run"
    except (SandboxError, OSError) as exc:
        check.error = f"{type(exc).__name__}: {exc}"
    return check
