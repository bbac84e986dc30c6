"""Errors of the pipeline orchestrator (one root, retriability as a class attribute)."""

from __future__ import annotations

__all__ = ["MissingComponentError", "PipelineConfigError", "PipelineError", "ServiceError", "StallError"]


class PipelineError(RuntimeError):
    """Root of everything the orchestrator raises."""

    retriable = False


class PipelineConfigError(PipelineError, ValueError):
    """The pipeline config is invalid; the message names the field and the fix."""


class MissingComponentError(PipelineError):
    """A service, command or module the pipeline needs is not available; names each one."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = list(missing)
        lines = "\n".join(f"  - {item}" for item in self.missing)
        super().__init__(f"the pipeline cannot run; missing:\n{lines}")


class ServiceError(PipelineError):
    """A service subprocess failed to start, died, or did not become ready in time."""

    retriable = True


class StallError(PipelineError):
    """Nothing moved for `pipeline.stall_timeout_s`; the message says which stage is stuck and why."""
