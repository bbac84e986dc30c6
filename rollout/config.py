"""The rollout service configuration: the `rollout:` section, read by the one config loader
(`stacx.schemas.config`). Unknown keys are errors naming their path, so a typo never silently falls
back to a default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from stacx.rollout.errors import ConfigError
from stacx.rollout.manager import RolloutManager
from stacx.rollout.teacher import TeacherInTheLoop
from stacx.schemas import topics

__all__ = [
    "DataConfig",
    "InferenceConfig",
    "KafkaConfig",
    "RolloutConfig",
    "SandboxConfig",
    "load_config",
]


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where tasks come from: a tasks.jsonl, Harbor task directories, the tasks topic, or a
    task-source plug-in."""

    path: str | None = None
    """tasks.jsonl of TaskSample rows."""
    task_dirs: str | None = None
    """Directory of Harbor-format tasks (each becomes a TaskSample)."""
    topic: str | None = None
    """Kafka topic of TaskSample events (e.g. stacx.tasks), read through a consumer group."""
    source: str | None = None
    """A task-source plug-in: registered name, `package.module:Factory`, or an entry point in
    `stacx.task_sources` (its `train_tasks()`; see stacx.rollout.data)."""
    source_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the task source."""
    consumer_group: str = "stacx-rollout"
    """Consumer group shared by rollout workers reading `topic`."""
    samples_per_task: PositiveInt = 1
    """GRPO group size n."""
    epochs: NonNegativeInt = 1
    """Passes over a file / directory source (0 = forever)."""
    shuffle: bool = False
    """Shuffle each epoch."""
    seed: int = 0
    """Shuffle seed."""

    def __post_init__(self) -> None:
        chosen = [name for name in ("path", "task_dirs", "topic", "source") if getattr(self, name)]
        if len(chosen) != 1:
            raise ConfigError(f"set exactly one of path, task_dirs, topic, source (got {chosen or 'none'})")


@dataclass(kw_only=True, slots=True)
class InferenceConfig:
    """The inference server (built-in or SGLang)."""

    url: str = "http://127.0.0.1:30000"
    """Base URL of the server."""
    tokenizer: str | None = None
    """HF tokenizer directory (usually the model directory)."""
    wait_ready_s: NonNegativeFloat = 0.0
    """At start, wait up to this long until the server's `/health` and a sandbox gateway's
    `/healthz` (any of `sandbox.urls`) answer, before the first episode (`stacx run` starts the
    rollout service together with them and sets it); 0: do not wait (requests still retry while
    one is unreachable)."""

    def __post_init__(self) -> None:
        if self.wait_ready_s < 0:
            raise ConfigError(f"inference.wait_ready_s = {self.wait_ready_s}; use >= 0 (0: do not wait)")


DEFAULT_GATEWAY_URL = "http://127.0.0.1:8700"


@dataclass(kw_only=True, slots=True)
class SandboxConfig:
    """The sandbox gateways (one per Docker host)."""

    url: str | None = None
    """Base URL of the only gateway (default http://127.0.0.1:8700); or use `urls`."""
    urls: list[str] = field(default_factory=list)
    """Base URLs of several gateways: each episode goes to the least-loaded one that is up."""
    preferred: list[str] = field(default_factory=list)
    """Those of `urls` used first (this host's own gateway); the others take episodes only while
    no preferred one is up with room."""
    token_env: str = "STACX_SANDBOX_TOKEN"
    """Environment variable holding the gateways' bearer token."""
    image: str = "stacx/sandbox:bookworm"
    """Image of sessions for tasks without task_dir or image."""
    idle_timeout_s: PositiveFloat = 300.0
    """A gateway closes a session after this long without a request; the engine renews live
    episodes' sessions every third of it, so only a crashed worker's sandboxes expire."""
    max_sessions_per_gateway: PositiveInt | None = None
    """Sessions one gateway gets from this worker at most (None: as many as it accepts)."""
    down_for_s: NonNegativeFloat = 30.0
    """A gateway that failed is left alone this long, then probed and used again."""
    request_timeout_s: PositiveFloat = 120.0
    """HTTP timeout of gateway calls other than exec (a session start may build an image)."""
    unresponsive_after_s: PositiveFloat = 10.0
    """A gateway whose oldest request has waited this long is asked /healthz; if that does not
    answer either, it is marked down and new episodes go to the other gateways."""

    def __post_init__(self) -> None:
        if self.request_timeout_s <= 0:
            raise ConfigError(f"sandbox.request_timeout_s = {self.request_timeout_s}; use > 0 seconds")
        if self.url and self.urls:
            raise ConfigError("sandbox: set `url` (one gateway) or `urls` (several), not both")
        bad = [u for u in self.gateway_urls() if not u.startswith(("http://", "https://"))]
        if bad:
            raise ConfigError(f"sandbox.urls: {bad} must start with http:// or https://")
        if len(set(self.gateway_urls())) != len(self.gateway_urls()):
            raise ConfigError(f"sandbox.urls lists a gateway twice: {self.urls}")
        unknown = [u for u in self.preferred if u not in self.gateway_urls()]
        if unknown:
            raise ConfigError(
                f"sandbox.preferred: {unknown} not in sandbox.urls; list each preferred gateway there"
            )

    def gateway_urls(self) -> list[str]:
        """Every gateway to use, in the order given."""
        return list(self.urls) or [self.url or DEFAULT_GATEWAY_URL]

    def token(self) -> str | None:
        return os.environ.get(self.token_env)


@dataclass(kw_only=True, slots=True)
class KafkaConfig:
    """Kafka: where trajectories go and where policy versions come from."""

    bootstrap_servers: str = field(
        default_factory=topics.default_bootstrap
    )
    """bootstrap.servers (default $STACX_KAFKA or 127.0.0.1:9092)."""
    publish: bool = True
    """Publish trajectories to `trajectories_topic` (false: keep them in memory, e.g. eval)."""
    trajectories_topic: str = topics.TRAJECTORIES
    """Where trajectories go."""
    follow_weights: bool = True
    """Follow `weights_topic` for the current policy version."""
    weights_topic: str = topics.WEIGHTS
    """Compacted topic of WeightVersion events."""
    weights_group: str | None = None
    """Consumer group of the weights follower (committed: its lag is visible); None:
    `stacx-rollout-weights-<model>-<host>-<pid>`. One per rollout worker."""


@dataclass(kw_only=True, slots=True)
class RolloutConfig:
    """Everything `stacx rollout` / `stacx eval` need."""

    data: DataConfig
    """Task source."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """Inference server."""
    sandbox: SandboxConfig | None = field(default_factory=SandboxConfig)
    """Sandbox gateway (null when every scaffold is sandbox-less)."""
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    """Kafka."""
    manager: RolloutManager.Config = field(default_factory=RolloutManager.Config)
    """Manager, pool, scheduler and evaluators."""
    teacher: TeacherInTheLoop.Config | None = None
    """Teacher in the loop (docs/teacher_student.md): its server `url`, `mode` (dagger, opd,
    aggrevate), `beta` schedule; None: the student alone."""
    num_groups: int | None = None
    """Stop after this many groups (None: the whole source)."""
    progress: bool = True
    """Live progress view on the terminal."""

    def __post_init__(self) -> None:
        if self.teacher is not None and not self.teacher.url:
            raise ConfigError("teacher.url is not set: the teacher's inference server")


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RolloutConfig:
    """A RolloutConfig from a YAML file (the whole file, or its `rollout:` section) through the one
    config loader (`stacx.schemas.config`), `overrides` (command-line field flags, nested) laid
    over it; relative data paths are resolved against the working directory, else the file's
    folder."""
    from stacx.schemas.config import ConfigError as FileError
    from stacx.schemas.config import build, deep_merge, file_section, load_yaml, resolve_path

    try:
        data, where = file_section(load_yaml(path), "rollout", RolloutConfig, str(path))
        config = build(RolloutConfig, deep_merge(data, overrides or {}), where=where)
    except FileError as exc:
        raise ConfigError(exc.lines) from exc
    for name in ("path", "task_dirs"):
        value = getattr(config.data, name)
        if value:
            setattr(config.data, name, str(resolve_path(value, Path(path).resolve().parent)))
    return config
