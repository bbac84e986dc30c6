"""Errors of the model factory."""

from __future__ import annotations

__all__ = ["ModelFactoryError"]


class ModelFactoryError(Exception):
    """A tiny model could not be built or written (bad override, unwritable directory)."""

    retriable = False
