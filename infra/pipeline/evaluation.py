"""Held-out evaluation through the real rollout path: the rollout engine's evaluator, the live
inference server and sandbox gateway; trajectories are kept in memory, never published."""

from __future__ import annotations

import asyncio
import copy
import math
import time
from dataclasses import dataclass
from typing import Any

from stacx.schemas.records import TaskSample, Trajectory

__all__ = ["EvalResult", "eval_figures", "evaluate_heldout", "run_evaluation", "versions_used"]


@dataclass(kw_only=True, slots=True)
class EvalResult:
    """Success rate and tool-use rate over held-out episodes."""

    success: float
    """Share of episodes whose reward reached `success_reward` (partial credit is no success)."""
    mean_reward: float
    tool_rate: float
    num_episodes: int
    num_failed: int
    version: int
    """The oldest policy version that generated a turn of it (the server's version when the
    evaluation started, if no turn says): a server may swap weights during an evaluation."""
    last_version: int
    """The newest policy version that generated a turn of it."""
    wall_s: float


class _Collector:
    """A TrajectoryPublisher that keeps trajectories in a list."""

    def __init__(self) -> None:
        self.trajectories: list[Trajectory] = []

    async def publish(self, trajectory: Trajectory) -> None:
        self.trajectories.append(trajectory)

    async def close(self) -> None:
        pass


def _eval_config(rollout_section: dict[str, Any], *, heldout_path: str, samples: int) -> Any:
    from stacx.infra.config import build
    from stacx.rollout.config import RolloutConfig

    section = copy.deepcopy(rollout_section)
    section["data"] = {"path": heldout_path, "samples_per_task": samples, "epochs": 1, "shuffle": False}
    section.setdefault("kafka", {}).update({"publish": False, "follow_weights": False})
    manager = section.setdefault("manager", {})
    manager["record_task_rewards"] = True
    manager["train_groups_per_version"] = 0  # evaluation never waits for the trainer
    section["progress"] = False
    section["num_groups"] = None
    return build(RolloutConfig, section, where="pipeline evaluation: rollout")


def eval_figures(result: EvalResult) -> dict[str, float]:
    """`eval/*` figures of one evaluation, for the trackers (logged at `result.version`)."""
    return {
        "eval/success": result.success,
        "eval/tool_rate": result.tool_rate,
        "eval/episodes": float(result.num_episodes),
        "eval/version_first": float(result.version),
        "eval/version_last": float(result.last_version),
    }


def versions_used(trajectories: list[Trajectory], default: int) -> tuple[int, int]:
    """(oldest, newest) policy version of the model turns (the server's `weight_version` of each
    generation); `default` for both when no turn has one."""
    used = [
        turn.policy_version
        for t in trajectories
        for turn in t.turns
        if turn.role == "assistant" and turn.policy_version is not None
    ]
    return (min(used), max(used)) if used else (default, default)


def _summarise(
    trajectories: list[Trajectory], version: int, started: float, success_reward: float = 1.0
) -> EvalResult:
    n = len(trajectories)
    first, last = versions_used(trajectories, version)
    rewards = [t.reward for t in trajectories if math.isfinite(t.reward)]
    solved = sum(reward >= success_reward for reward in rewards)
    tools = sum(int(t.metadata.get("num_tool_calls", "0") or 0) > 0 for t in trajectories)
    failed = sum(t.status.value in ("FAILED", "TIMED_OUT") for t in trajectories)
    return EvalResult(
        success=solved / n if n else 0.0,
        mean_reward=sum(rewards) / n if n else 0.0,
        tool_rate=tools / n if n else 0.0,
        num_episodes=n,
        num_failed=failed,
        version=first,
        last_version=last,
        wall_s=time.monotonic() - started,
    )


async def evaluate_heldout(
    rollout_section: dict[str, Any],
    tasks: list[TaskSample],
    *,
    heldout_path: str,
    samples: int,
    version: int,
    success_reward: float = 1.0,
) -> EvalResult:
    """Roll out every task `samples` times at the rollout config's temperature; an episode with
    a reward of at least `success_reward` is a success."""
    from stacx.rollout.fakes import StaticVersion
    from stacx.rollout.service import open_manager

    started = time.monotonic()
    config = _eval_config(rollout_section, heldout_path=heldout_path, samples=samples)
    collector = _Collector()
    async with open_manager(
        config, tasks=tasks, publisher=collector, versions=StaticVersion(version)
    ) as manager:
        await manager.run()
    return _summarise(collector.trajectories, version, started, success_reward)


def run_evaluation(rollout_section: dict[str, Any], tasks: list[TaskSample], **options: Any) -> EvalResult:
    """Blocking wrapper of `evaluate_heldout` (runs its own event loop; call it from a worker thread)."""
    return asyncio.run(evaluate_heldout(rollout_section, tasks, **options))
