"""Kafka topic names and their default configurations (ARCHITECTURE.md, "Topics")."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from pydantic import PositiveInt

TRAJECTORIES = "stacx.trajectories"
BATCHES = "stacx.batches"
WEIGHTS = "stacx.weights"
AGENT_LOGS = "stacx.agent-logs"
FEEDBACK = "stacx.feedback"
TASKS = "stacx.tasks"
DLQ = "stacx.dlq"
SCHEMAS = "stacx.schemas"
ONCALL_TRAJECTORIES = "stacx.oncall.trajectories"
"""Rewarded trajectories of the on-call join (created by the join worker, 1 partition)."""

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "STACX_KAFKA"


def default_bootstrap() -> str:
    """Kafka bootstrap servers: `$STACX_KAFKA`, else the local broker."""
    return os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP)


# Records above this size go through the claim check (see ARCHITECTURE.md, "Topics").
BATCHES_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic and its configuration; `TopicPolicy.apply` adds retention and replication."""

    name: str
    """Topic name."""
    partitions: int = 4
    """Partition count: the unit of consumer parallelism."""
    config: dict[str, str] = field(default_factory=dict)
    """Broker-side topic configs (`cleanup.policy`, `max.message.bytes`, ...)."""
    replication_factor: int = 1
    """Copies of each partition (set by `TopicPolicy.apply`)."""

    @property
    def compacted(self) -> bool:
        return self.config.get("cleanup.policy") == "compact"


_COMPRESSIONS = ("producer", "none", "gzip", "snappy", "lz4", "zstd")
_DAY_MS = 24 * 3600 * 1000


@dataclass(kw_only=True, slots=True)
class TopicPolicy:
    """How STACX creates every topic it owns: replication, partitions, retention, compression.

    The defaults suit one local broker; `TopicPolicy.cluster()` suits three or more brokers.
    Compacted topics (weights, schema catalogue) keep their latest record per key whatever the
    retention says."""

    replication_factor: PositiveInt = 1
    """Copies of each partition (3 on a cluster: an unreplicated topic is lost with its broker)."""
    min_insync_replicas: PositiveInt | None = None
    """`min.insync.replicas`: replicas an acks=all write waits for (None: the broker's default)."""
    retention_ms: int = 30 * _DAY_MS
    """How long delete-policy topics keep records (-1: forever): the replay horizon."""
    retention_bytes: int = 4 * 1024**3
    """Size cap per partition of delete-policy topics (-1: none); the oldest segments go first."""
    compression: str = "producer"
    """Broker-side `compression.type`: `producer` stores batches as the producer compressed them
    (no recompression); gzip, snappy, lz4, zstd or none make the broker recompress."""
    partitions: dict[str, int] = field(default_factory=dict)
    """Partition counts by topic kind (`trajectories`, `batches`, `tasks`, ...), over the defaults."""

    def __post_init__(self) -> None:
        if self.replication_factor < 1:
            raise ValueError(f"topics.replication_factor={self.replication_factor}: must be >= 1")
        isr = self.min_insync_replicas
        if isr is not None and not 1 <= isr <= self.replication_factor:
            raise ValueError(
                f"topics.min_insync_replicas={self.min_insync_replicas}: must be between 1 and "
                f"replication_factor={self.replication_factor}"
            )
        for name in ("retention_ms", "retention_bytes"):
            value = getattr(self, name)
            if value == 0 or value < -1:
                raise ValueError(f"topics.{name}={value}: use a positive value or -1 (no limit)")
        if self.compression not in _COMPRESSIONS:
            choices = ", ".join(_COMPRESSIONS)
            raise ValueError(f"topics.compression={self.compression!r}: use one of {choices}")
        bad = {k: v for k, v in self.partitions.items() if v < 1 or k not in KINDS}
        if bad:
            raise ValueError(f"topics.partitions={bad}: kinds are {', '.join(KINDS)}, counts >= 1")

    @classmethod
    def cluster(cls) -> TopicPolicy:
        """Defaults for a cluster of three or more brokers."""
        return cls(replication_factor=3, min_insync_replicas=2)

    def apply(self, spec: TopicSpec, *, kind: str | None = None) -> TopicSpec:
        """`spec` with this policy's replication, partitions (for `kind`), retention and compression."""
        config = {**spec.config, "compression.type": self.compression}
        if not spec.compacted:
            config["retention.ms"] = str(self.retention_ms)
            config["retention.bytes"] = str(self.retention_bytes)
        if self.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.min_insync_replicas)
        partitions = self.partitions.get(kind or kind_of(spec.name) or "", spec.partitions)
        return replace(spec, partitions=partitions, config=config, replication_factor=self.replication_factor)

    def internal_config(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Configs of a stream processor's own delete-policy topics (ticks, repartition)."""
        return self.apply(TopicSpec("internal", config=dict(base or {})), kind="").config


def kind_of(name: str) -> str | None:
    """`trajectories` for `stacx.trajectories` and for a run's `stacx.trajectories.<run id>`."""
    for kind, standard in sorted(_KIND_TOPICS.items(), key=lambda kv: -len(kv[1])):
        if name == standard or name.startswith(standard + "."):
            return kind
    return None


def _compacted() -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "0.1",
        "segment.ms": "600000",
        "max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES),
    }


def _retained(max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> dict[str, str]:
    return {
        "cleanup.policy": "delete",
        "max.message.bytes": str(max_bytes),
        "compression.type": "producer",
    }


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(TRAJECTORIES, partitions=8, config=_retained()),
    TopicSpec(BATCHES, partitions=1, config=_retained(BATCHES_MAX_MESSAGE_BYTES)),
    TopicSpec(WEIGHTS, partitions=1, config=_compacted()),
    TopicSpec(AGENT_LOGS, partitions=4, config=_retained()),
    TopicSpec(FEEDBACK, partitions=4, config=_retained()),
    TopicSpec(TASKS, partitions=8, config=_retained()),
    TopicSpec(DLQ, partitions=1, config=_retained()),
    TopicSpec(SCHEMAS, partitions=1, config=_compacted()),
)

_KIND_TOPICS = {t.name.removeprefix("stacx."): t.name for t in TOPICS}
KINDS: tuple[str, ...] = tuple(_KIND_TOPICS)
"""Topic kinds (`trajectories`, `batches`, `weights`, ...): the standard names without `stacx.`."""


def spec_for(kind: str, name: str | None = None) -> TopicSpec:
    """The standard spec of `kind` (`trajectories`, ...) under `name` (default: the standard name)."""
    base = next(t for t in TOPICS if t.name == _KIND_TOPICS[kind])
    return base if name is None else replace(base, name=name)


def policy_specs(policy: TopicPolicy, specs: tuple[TopicSpec, ...] = TOPICS) -> tuple[TopicSpec, ...]:
    """`specs` under `policy`."""
    return tuple(policy.apply(s) for s in specs)
