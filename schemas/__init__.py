"""Event records, Avro schemas and topic names: the contract every STACX service speaks."""

from stacx.schemas import topics
from stacx.schemas.records import (
    AgentInteraction,
    DeadLetter,
    Feedback,
    TaskSample,
    ToolCall,
    TrainingBatch,
    Trajectory,
    TrajectoryStatus,
    Turn,
    WeightVersion,
    logprobs,
    loss_mask,
    now_ms,
    token_ids,
    trajectory_id,
)

__all__ = [
    "AgentInteraction",
    "DeadLetter",
    "Feedback",
    "TaskSample",
    "ToolCall",
    "TrainingBatch",
    "Trajectory",
    "TrajectoryStatus",
    "Turn",
    "WeightVersion",
    "logprobs",
    "loss_mask",
    "now_ms",
    "token_ids",
    "topics",
    "trajectory_id",
]
