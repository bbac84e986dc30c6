"""Errors of the local services: each says what is wrong and how to fix it."""

from __future__ import annotations


class InfraError(RuntimeError):
    """A local service could not be installed, started or reached."""

    retriable = False
