"""When the online learner trains: N newly rewarded trajectories, or T seconds since the oldest."""

from __future__ import annotations

from dataclasses import dataclass

from stacx.trainer.errors import ConfigError

__all__ = ["ReadinessPolicy"]


class ReadinessPolicy:
    """Fires on `min_trajectories` pending, or after `max_wait_s` with at least `min_on_timeout`."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        min_trajectories: int = 64
        """Train as soon as this many new rewarded trajectories are pending."""
        max_wait_s: float | None = 600.0
        """Or once the oldest pending one waited this long (None: count only)."""
        min_on_timeout: int = 8
        """...provided at least this many are pending (a tiny batch is mostly noise)."""
        max_trajectories: int = 256
        """Largest batch: more pending trajectories wait for the next step."""

        def __post_init__(self) -> None:
            if not 1 <= self.min_on_timeout <= self.min_trajectories <= self.max_trajectories:
                raise ConfigError(
                    "readiness: need 1 <= min_on_timeout <= min_trajectories <= max_trajectories, got "
                    f"{self.min_on_timeout}, {self.min_trajectories}, {self.max_trajectories}"
                )
            if self.max_wait_s is not None and self.max_wait_s <= 0:
                raise ConfigError(f"readiness.max_wait_s={self.max_wait_s}: use > 0 or null")

    def __init__(self, config: Config) -> None:
        self.config = config

    def reason(self, num_pending: int, oldest_age_s: float) -> str | None:
        """`count` or `time` when a step should run now, else None."""
        cfg = self.config
        if num_pending >= cfg.min_trajectories:
            return "count"
        if (
            cfg.max_wait_s is not None
            and num_pending >= cfg.min_on_timeout
            and oldest_age_s >= cfg.max_wait_s
        ):
            return "time"
        return None
