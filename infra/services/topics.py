"""Idempotent creation of the topics of ARCHITECTURE.md (names and configs live in `stacx.schemas.topics`)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from stacx.infra.services.errors import InfraError
from stacx.schemas.topics import TOPICS, TopicPolicy, TopicSpec

_WARNINGS = 4
"""librdkafka's syslog level for these short-lived clients: warnings and worse, no info lines."""


def ensure_topics(
    bootstrap: str, specs: tuple[TopicSpec, ...] = TOPICS, policy: TopicPolicy | None = None
) -> list[str]:
    """Create missing topics and bring configs of existing ones in line, all under `policy`
    (default: one node's); return one line each."""
    policy = policy or TopicPolicy()
    specs = tuple(policy.apply(spec) for spec in specs)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": _WARNINGS})
    existing = set(admin.list_topics(timeout=15).topics)
    lines = [_create(admin, spec) for spec in specs if spec.name not in existing]
    lines += [_align(admin, spec) for spec in specs if spec.name in existing]
    return lines


def _create(admin: AdminClient, spec: TopicSpec) -> str:
    new = NewTopic(
        spec.name,
        num_partitions=spec.partitions,
        replication_factor=spec.replication_factor,
        config=dict(spec.config),
    )
    try:
        admin.create_topics([new])[spec.name].result(timeout=30)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return f"topic {spec.name}: exists"
        raise InfraError(f"cannot create topic {spec.name}: {exc}") from exc
    return f"topic {spec.name}: created ({spec.partitions} partitions)"


def _align(admin: AdminClient, spec: TopicSpec) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name, set_config=dict(spec.config))
    try:
        admin.alter_configs([resource])[resource].result(timeout=30)
    except KafkaException as exc:
        raise InfraError(f"cannot update the configs of topic {spec.name}: {exc}") from exc
    return f"topic {spec.name}: exists"


def missing_topics(bootstrap: str, names: list[str], *, timeout_s: float = 10.0) -> list[str] | None:
    """The `names` the cluster does not have (None: the cluster did not answer)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": _WARNINGS})
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException:
        return None
    return [name for name in names if name not in existing]
