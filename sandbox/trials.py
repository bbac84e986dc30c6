"""One Harbor trial in one session: every step in order, each verified, rewards per step and in total.

A step is: upload steps/<name>/workdir/ to the working directory and run its setup.sh (multi-step
tasks), the step's healthcheck, the agent, then the verifier. A step whose reward is below its
`min_reward` stops the remaining ones. The total follows `multi_step_reward_strategy`: `mean`
(per-key mean over the verified steps, a missing key counting 0) or `final` (the last step's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from stacx.sandbox.errors import HealthcheckFailed
from stacx.sandbox.models import VerifyResult
from stacx.sandbox.paths import tar_directory
from stacx.sandbox.protocols import SandboxOps
from stacx.sandbox.task_config import Healthcheck
from stacx.sandbox.tasks import HarborTask, TaskStep
from stacx.sandbox.verifier import scalar_reward, verify

__all__ = ["Agent", "StepOutcome", "TrialOutcome", "run_healthcheck", "run_trial", "total_rewards"]

Agent = Callable[[TaskStep], Awaitable[None]]
"""Acts on one step (its instruction is `step.instruction`) in the session."""


@dataclass(kw_only=True, slots=True)
class StepOutcome:
    name: str
    result: VerifyResult


@dataclass(kw_only=True, slots=True)
class TrialOutcome:
    reward: float
    rewards: dict[str, float]
    steps: list[StepOutcome] = field(default_factory=list)
    stopped_after: str | None = None
    """Step whose reward was below its min_reward (the later steps did not run)."""


async def run_healthcheck(ops: SandboxOps, session_id: str, check: Healthcheck, *, where: str) -> None:
    """Docker HEALTHCHECK semantics: healthy at the first success, failed after `retries` failures
    (failures inside `start_period_s` do not count)."""
    loop = asyncio.get_running_loop()
    grace_until = loop.time() + check.start_period_s
    failures = 0
    while True:
        run = await ops.exec(session_id, check.command, timeout_s=check.timeout_s)
        if run.ok:
            return
        failures += int(loop.time() >= grace_until)
        if failures >= check.retries:
            output = (run.stdout + run.stderr).strip()[-300:]
            raise HealthcheckFailed(
                f"{where} healthcheck `{check.command}` failed {failures} times "
                f"(exit {run.exit_code}): {output!r}"
            )
        await asyncio.sleep(check.interval_s)


async def _prepare_step(ops: SandboxOps, session_id: str, step: TaskStep, workdir: str) -> None:
    if step.workdir_dir.is_dir():
        await ops.upload_archive(session_id, workdir, tar_directory(step.workdir_dir))
        if (step.workdir_dir / "setup.sh").is_file():
            run = await ops.exec(session_id, f"bash {workdir.rstrip('/')}/setup.sh", timeout_s=600)
            if not run.ok:
                raise HealthcheckFailed(
                    f"step {step.name}: workdir/setup.sh exited {run.exit_code}: {run.stderr.strip()[-300:]}"
                )
    if step.config.healthcheck is not None:
        await run_healthcheck(ops, session_id, step.config.healthcheck, where=f"step {step.name}")


def _below(rewards: dict[str, float], threshold: float | dict[str, float]) -> bool:
    limits = {"reward": threshold} if isinstance(threshold, float) else threshold
    return any(rewards.get(k, float("-inf")) < v for k, v in limits.items())


def total_rewards(task: HarborTask, steps: list[StepOutcome]) -> dict[str, float]:
    """The trial's named rewards from its verified steps (`mean` or `final` strategy)."""
    if not steps:
        return {"reward": 0.0}
    if task.multi_step_reward_strategy == "final" or len(steps) == 1:
        return dict(steps[-1].result.rewards)
    keys = dict.fromkeys(k for s in steps for k in s.result.rewards)
    return {k: sum(s.result.rewards.get(k, 0.0) for s in steps) / len(steps) for k in keys}


async def run_trial(
    ops: SandboxOps, session_id: str, task: HarborTask, agent: Agent, *, workdir: str
) -> TrialOutcome:
    """Run `agent` through every step of `task` in the session `session_id` (working directory
    `workdir`) and verify each step."""
    if task.healthcheck is not None:
        await run_healthcheck(ops, session_id, task.healthcheck, where=f"task {task.name}")
    outcomes: list[StepOutcome] = []
    stopped = None
    for step in task.steps:
        if task.multi_step:
            await _prepare_step(ops, session_id, step, workdir)
        await agent(step)
        result = await verify(ops, session_id, task, step)
        outcomes.append(StepOutcome(name=step.name, result=result))
        if step.config.min_reward is not None and _below(result.rewards, step.config.min_reward):
            stopped = step.name
            break
    rewards = total_rewards(task, outcomes)
    return TrialOutcome(reward=scalar_reward(rewards), rewards=rewards, steps=outcomes, stopped_after=stopped)
