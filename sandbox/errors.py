"""Exceptions of the sandbox package: one root, an HTTP status and retriability per class.

The gateway turns a `SandboxError` into `{"error": {"type": ..., "message": ...}}` with the class's
`status`; the client raises the same class again from that body, so callers catch one hierarchy
whether they talk to a backend in-process or to a gateway over HTTP.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BackendError",
    "BaseImageMissing",
    "CapacityExceeded",
    "EngineWedged",
    "FileOperationFailed",
    "GatewayConfigError",
    "HealthcheckFailed",
    "ImageBuildError",
    "InvalidSpec",
    "LimitExceeded",
    "PathRejected",
    "RewardFileEmpty",
    "RewardFileMalformed",
    "RewardFileMissing",
    "RequestTimeout",
    "RequestTooLarge",
    "RewardError",
    "SandboxError",
    "SandboxFileNotFound",
    "SandboxStopped",
    "SessionExpired",
    "SessionNotFound",
    "TaskFormatError",
    "TaskUnsupported",
    "error_class",
]


class SandboxError(Exception):
    """Root of every error raised by `sandbox`."""

    status: int = 500
    retriable: bool = False


class AuthError(SandboxError):
    """Missing or wrong bearer token."""

    status = 401


class InvalidSpec(SandboxError):
    """A request field is out of range or inconsistent; the message names the field."""

    status = 422


class LimitExceeded(SandboxError):
    """A session asks for more than the gateway's operator allows one session (cpus, memory,
    pids, idle timeout); the message names the field and the maximum."""

    status = 400


class RequestTooLarge(SandboxError):
    """A request body is larger than the gateway accepts for that route."""

    status = 413


class RequestTimeout(SandboxError):
    """A request (head or body) stopped arriving before it was whole; send it again."""

    status = 408
    retriable = True


class GatewayConfigError(SandboxError):
    """The gateway's limits do not fit each other or the host (pid_max, memory, cores); raised at
    construction, the message names the field and the fix."""


class PathRejected(SandboxError):
    """A file path escapes the sandbox's writable roots (absolute elsewhere, `..`, links)."""

    status = 400


class FileOperationFailed(SandboxError):
    """A file operation the client asked for failed inside the sandbox for a reason of the
    sandbox's state (a path that is a file where a directory is needed, no permission, a full
    tmpfs); the message carries the tool's own words."""

    status = 409


class SessionNotFound(SandboxError):
    """No live session has this id (never created, closed, or reaped)."""

    status = 404


class SessionExpired(SessionNotFound):
    """The session passed its maximum lifetime or idle timeout and was closed."""


class SandboxFileNotFound(SandboxError):
    """The requested file does not exist inside the sandbox."""

    status = 404


class CapacityExceeded(SandboxError):
    """The gateway already runs its maximum number of sessions; retry later."""

    status = 503
    retriable = True


class BackendError(SandboxError):
    """The container engine or process backend failed."""

    status = 502
    retriable = True


class EngineWedged(BackendError):
    """The container engine stopped answering (a lifecycle call outlived its limit); the message
    names the engine, the stuck call and the fix."""

    status = 503


class BaseImageMissing(SandboxError):
    """An image (or a Dockerfile's FROM image) is not available locally."""

    status = 424


class ImageBuildError(SandboxError):
    """`docker build` of a task environment failed."""

    status = 424


class SandboxStopped(BackendError):
    """The sandbox's container is no longer running (its ENTRYPOINT or main process exited)."""

    status = 409
    retriable = False


class TaskUnsupported(SandboxError):
    """The task needs something sandboxes cannot give (GPUs, Windows, several containers)."""

    status = 501


class HealthcheckFailed(SandboxError):
    """A task's (or step's) healthcheck did not pass within its retries."""

    status = 424


class TaskFormatError(SandboxError):
    """A Harbor task directory is malformed; the message names the file and the field."""

    status = 422


class RewardError(SandboxError):
    """The verifier did not leave a usable reward."""

    status = 422


class RewardFileMissing(RewardError):
    """Neither /logs/verifier/reward.json nor reward.txt exists after test.sh."""


class RewardFileEmpty(RewardError):
    """The reward file exists but is empty."""


class RewardFileMalformed(RewardError):
    """The reward file is not one float (txt) or a JSON object of numbers (json)."""


_ALL: dict[str, type[SandboxError]] = {
    cls.__name__: cls
    for cls in (
        SandboxError,
        AuthError,
        InvalidSpec,
        LimitExceeded,
        RequestTooLarge,
        RequestTimeout,
        GatewayConfigError,
        PathRejected,
        FileOperationFailed,
        SessionNotFound,
        SessionExpired,
        SandboxFileNotFound,
        CapacityExceeded,
        BackendError,
        EngineWedged,
        BaseImageMissing,
        ImageBuildError,
        SandboxStopped,
        TaskUnsupported,
        HealthcheckFailed,
        TaskFormatError,
        RewardError,
        RewardFileMissing,
        RewardFileEmpty,
        RewardFileMalformed,
    )
}


def error_class(name: str) -> type[SandboxError]:
    """The exception class named `name`, or `SandboxError` for an unknown name."""
    return _ALL.get(name, SandboxError)
