"""Exceptions of the trainer: one root, `retriable` as a class attribute."""

from __future__ import annotations

from stacx.schemas.config import ConfigError as _SharedConfigError

__all__ = [
    "BatchValidationError",
    "CheckpointError",
    "ConfigError",
    "RecipeError",
    "SourceError",
    "TrainerError",
]


class TrainerError(Exception):
    """Root of every error the trainer raises."""

    retriable: bool = False


class ConfigError(TrainerError, _SharedConfigError):
    """A trainer config field is missing or invalid; the message names the field and the fix
    (a `stacx.schemas.config.ConfigError`: the config loader reports it with its field path)."""


class RecipeError(TrainerError):
    """A recipe is unknown or declares inconsistent roles, models or data syncs."""


class BatchValidationError(TrainerError):
    """A TrainingBatch is malformed (e.g. its packed arrays disagree in length); never trained on."""


class CheckpointError(TrainerError):
    """A checkpoint could not be written or read back."""


class SourceError(TrainerError):
    """The batch source (Kafka or replay) failed."""

    retriable = True


class RankError(TrainerError):
    """A spawned rank died by a signal or exited non-zero; the launcher stopped the other ranks."""

