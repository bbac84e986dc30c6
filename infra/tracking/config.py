"""The `pipeline.tracking` section: which trackers a run feeds, and how it feeds them."""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TrackerSpec", "TrackingConfig"]


class TrackerSpec(BaseModel):
    """One tracker: a name (`tensorboard`, `wandb`, `mlflow`, an entry point of `stacx.trackers`,
    or `package.module:factory`) and its keyword options."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """The tracker; its files go to `runs/<name>/tracking/<tracker name>/`."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of its factory (e.g. `project` for wandb)."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @pydantic.model_validator(mode="after")
    def _buildable(self) -> TrackerSpec:
        from stacx.infra.tracking.registry import tracker_problem

        problem = tracker_problem(self.name, self.options)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def folder(self) -> str:
        """Its folder name under `tracking/` (a dotted path's object name)."""
        return self.name.rpartition(":")[2].rpartition(".")[2] or self.name


class TrackingConfig(BaseModel):
    """`tracking: [tensorboard, wandb, mlflow]`, or the same list under `trackers:` with the
    settings below. Trackers are fed from the run's topics and the servers' metrics."""

    model_config = ConfigDict(extra="forbid")

    trackers: list[TrackerSpec] = Field(default_factory=list)
    """The trackers, each a name or `{name, options}`."""
    samples_per_version: int = Field(default=4, ge=0)
    """Sample trajectories in each version's `trajectories` table."""
    settle_versions: int = Field(default=2, ge=1)
    """A version's rollout figures are first logged once the trainer has published this many newer
    versions; an episode of it that arrives later logs the row again (revised)."""
    success_reward: float = 1.0
    """An episode with at least this reward counts as a success."""
    summary_min_episodes: int | None = Field(default=None, ge=1)
    """The run's summary (W&B summary, MLflow `summary.*` tags) is the newest version with at least
    this many episodes (default: half the median per version), not a tail of a few late ones."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        return {"trackers": value} if isinstance(value, list) else value

    @pydantic.model_validator(mode="after")
    def _distinct(self) -> TrackingConfig:
        folders = [t.folder for t in self.trackers]
        twice = sorted({f for f in folders if folders.count(f) > 1})
        if twice:
            raise ValueError(f"trackers {twice} are listed twice; list each tracker once")
        return self
