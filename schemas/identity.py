"""Default Kafka keys and record ids of the STACX record types (ARCHITECTURE.md, "Topics")."""

from __future__ import annotations

from collections.abc import Callable

from stacx.schemas.claimcheck import ClaimCheck
from stacx.schemas.records import (
    AgentInteraction,
    DeadLetter,
    Feedback,
    TaskSample,
    TrainingBatch,
    Trajectory,
    WeightVersion,
)

__all__ = ["record_id", "record_key"]

_KEYS: dict[type, Callable[[object], str | bytes | None]] = {
    Trajectory: lambda r: r.group_id,  # type: ignore[attr-defined]
    TaskSample: lambda r: r.task_id,  # type: ignore[attr-defined]
    TrainingBatch: lambda r: r.batch_id,  # type: ignore[attr-defined]
    WeightVersion: lambda r: r.model_name,  # type: ignore[attr-defined]
    AgentInteraction: lambda r: r.session_id,  # type: ignore[attr-defined]
    Feedback: lambda r: r.session_id,  # type: ignore[attr-defined]
    DeadLetter: lambda r: r.key,  # type: ignore[attr-defined]
    ClaimCheck: lambda r: r.record_id,  # type: ignore[attr-defined]
}

_IDS: dict[type, Callable[[object], str]] = {
    Trajectory: lambda r: r.trajectory_id,  # type: ignore[attr-defined]
    TaskSample: lambda r: r.task_id,  # type: ignore[attr-defined]
    TrainingBatch: lambda r: r.batch_id,  # type: ignore[attr-defined]
    WeightVersion: lambda r: f"{r.model_name}@{r.version}",  # type: ignore[attr-defined]
    AgentInteraction: lambda r: r.interaction_id,  # type: ignore[attr-defined]
    Feedback: lambda r: f"{r.session_id}/{r.interaction_id or ''}/{r.source}",  # type: ignore[attr-defined]
    DeadLetter: lambda r: (  # type: ignore[attr-defined]
        f"{r.source_topic}/{r.source_partition}/{r.source_offset}"  # type: ignore[attr-defined]
    ),
    ClaimCheck: lambda r: r.record_id or r.sha256,  # type: ignore[attr-defined]
}


def record_key(record: object) -> str | bytes | None:
    """The Kafka key a record is published under by default (group id for trajectories, ...)."""
    getter = _KEYS.get(type(record))
    return getter(record) if getter else None


def record_id(record: object) -> str:
    """A stable id of the record (trajectory id, batch id, ...) for deduplication and logs."""
    getter = _IDS.get(type(record))
    return getter(record) if getter else ""
