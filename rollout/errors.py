"""Exceptions of the rollout engine: one root, retriability as a class attribute."""

from __future__ import annotations

from stacx.schemas.config import ConfigError as _SharedConfigError

__all__ = [
    "ConfigError",
    "EnvironmentStepError",
    "EpisodeError",
    "InferenceCallError",
    "ResourceDeadlockError",
    "RewardError",
    "RolloutError",
    "ServicesNotReadyError",
]


class RolloutError(Exception):
    """Root of every error the rollout engine raises."""

    retriable: bool = False


class ConfigError(RolloutError, _SharedConfigError):
    """A configuration value is missing or invalid; the message names the field and the fix
    (a `stacx.schemas.config.ConfigError`: the config loader reports it with its field path)."""


class ResourceDeadlockError(ConfigError):
    """The global budget cannot satisfy some evaluator's maximal demand: it could never run."""


class ServicesNotReadyError(RolloutError):
    """The inference server or a sandbox gateway did not answer within `inference.wait_ready_s`."""


class EpisodeError(RolloutError):
    """An episode failed; the trajectory is published with status FAILED and this reason."""


class InferenceCallError(EpisodeError):
    """The inference server failed to generate (after the client's own retries)."""

    retriable = True


class EnvironmentStepError(EpisodeError):
    """The sandbox (gateway, session or verifier) failed."""

    retriable = True


class RewardError(EpisodeError):
    """The reward could not be computed (verifier broken, unknown reward function...)."""
