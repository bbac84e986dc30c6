"""STACX environment engine: the sandbox gateway, its backends, Harbor tasks and verifier.

The rollout engine uses `SandboxClient` (HTTP) and the models; tests use
`stacx.sandbox.testing.serve_gateway` with `FakeBackend`, `ProcessBackend` or `DockerBackend`.
"""

from stacx.sandbox.client import SandboxClient
from stacx.sandbox.errors import SandboxError
from stacx.sandbox.models import (
    ExecRequest,
    ExecResult,
    FileWritten,
    Health,
    SessionInfo,
    SessionSpec,
    VerifyResult,
)
from stacx.sandbox.tasks import HarborTask, discover_tasks, load_task, to_task_sample

__all__ = [
    "ExecRequest",
    "ExecResult",
    "FileWritten",
    "HarborTask",
    "Health",
    "SandboxClient",
    "SandboxError",
    "SessionInfo",
    "SessionSpec",
    "VerifyResult",
    "discover_tasks",
    "load_task",
    "to_task_sample",
]
