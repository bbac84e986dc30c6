"""Hypothesis strategies for every STACX record type, a comparable view of records, and a minimal
`trajectory()` for tests that need one record of no particular content."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np
from hypothesis import strategies as st

from stacx.schemas.claimcheck import ClaimCheck
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
)

text = st.text(max_size=20)
longs = st.integers(-(2**63), 2**63 - 1)
ints = st.integers(-(2**31), 2**31 - 1)
doubles = st.floats(allow_nan=False)
str_maps = st.dictionaries(text, text, max_size=3)
float_maps = st.dictionaries(text, doubles, max_size=3)
opt_text = st.none() | text


def int32s(max_size: int = 20) -> st.SearchStrategy[np.ndarray]:
    return st.lists(ints, max_size=max_size).map(lambda v: np.asarray(v, dtype=np.int32))


def uint8s(max_size: int = 20) -> st.SearchStrategy[np.ndarray]:
    return st.lists(st.integers(0, 255), max_size=max_size).map(lambda v: np.asarray(v, dtype=np.uint8))


def float32s(max_size: int = 20) -> st.SearchStrategy[np.ndarray]:
    return st.lists(st.floats(width=32, allow_nan=False), max_size=max_size).map(
        lambda v: np.asarray(v, dtype=np.float32)
    )


tool_calls = st.builds(ToolCall, id=text, name=text, arguments=text)
turns = st.builds(
    Turn,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    text=text,
    token_ids=int32s(),
    tool_calls=st.lists(tool_calls, max_size=2),
    observation=opt_text,
    policy_version=st.none() | longs,
    started_at_ms=longs,
    duration_ms=longs,
)

RECORDS: dict[type, st.SearchStrategy[Any]] = {
    Trajectory: st.builds(
        Trajectory,
        trajectory_id=text,
        group_id=text,
        sample_index=ints,
        task_id=text,
        task_type=text,
        model_name=text,
        policy_version=longs,
        turns=st.lists(turns, max_size=3),
        token_ids=int32s(),
        loss_mask=uint8s(),
        logprobs=float32s(),
        temperature=doubles,
        prompt_length=ints,
        rewards=float_maps,
        reward=doubles,
        status=st.sampled_from(TrajectoryStatus),
        error=opt_text,
        metadata=str_maps,
        created_at_ms=longs,
    ),
    TaskSample: st.builds(
        TaskSample,
        task_id=text,
        task_type=text,
        prompt=text,
        data=text,
        task_dir=opt_text,
        image=opt_text,
        priority=ints,
        metadata=str_maps,
        created_at_ms=longs,
    ),
    TrainingBatch: st.builds(
        TrainingBatch,
        batch_id=text,
        model_name=text,
        trajectory_ids=st.lists(text, max_size=3),
        group_ids=st.lists(text, max_size=3),
        task_types=st.lists(text, max_size=3),
        policy_versions=int32s(),
        offsets=int32s(),
        lengths=int32s(),
        prompt_lengths=int32s(),
        token_ids=int32s(),
        loss_mask=uint8s(),
        logprobs=float32s(),
        rewards=float32s(),
        advantages=st.none() | float32s(),
        temperatures=st.none() | float32s(),
        logprobs_recorded=st.none() | uint8s(),
        metadata=str_maps,
        created_at_ms=longs,
    ),
    WeightVersion: st.builds(
        WeightVersion,
        model_name=text,
        version=longs,
        path=text,
        step=longs,
        format=text,
        trainer_id=text,
        metadata=str_maps,
        created_at_ms=longs,
        content_hash=text,
    ),
    AgentInteraction: st.builds(
        AgentInteraction,
        session_id=text,
        interaction_id=text,
        agent_name=text,
        model_name=text,
        policy_version=longs,
        messages=text,
        response=text,
        token_ids=int32s(),
        loss_mask=uint8s(),
        logprobs=float32s(),
        task_type=text,
        metadata=str_maps,
        created_at_ms=longs,
    ),
    Feedback: st.builds(
        Feedback,
        session_id=text,
        reward=doubles,
        interaction_id=opt_text,
        components=float_maps,
        source=text,
        metadata=str_maps,
        created_at_ms=longs,
    ),
    DeadLetter: st.builds(
        DeadLetter,
        source_topic=text,
        source_partition=ints,
        source_offset=longs,
        reason=text,
        error_type=text,
        key=st.none() | st.binary(max_size=10),
        value=st.none() | st.binary(max_size=30),
        headers=str_maps,
        created_at_ms=longs,
    ),
    ClaimCheck: st.builds(
        ClaimCheck,
        uri=text,
        size_bytes=longs,
        sha256=text,
        record_type=text,
        record_id=text,
        created_at_ms=longs,
    ),
}


def comparable(value: Any) -> Any:
    """Records as nested tuples (arrays as dtype + bytes) so `==` works."""
    if isinstance(value, np.ndarray):
        return (
            "ndarray",
            value.dtype.newbyteorder("<").str,
            value.astype(value.dtype.newbyteorder("<")).tobytes(),
        )
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__,) + tuple(
            (f.name, comparable(getattr(value, f.name))) for f in dataclasses.fields(value)
        )
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    return value


def trajectory(i: int = 0, **fields: Any) -> Trajectory:
    """A valid Trajectory with only the required fields set (`traj-{i}`, sample `i`), plus `fields`."""
    base: dict[str, Any] = {
        "trajectory_id": f"traj-{i}",
        "group_id": "g",
        "sample_index": i,
        "task_id": "k",
        "task_type": "x",
        "model_name": "m",
        "policy_version": 0,
    }
    return Trajectory(**(base | fields))
