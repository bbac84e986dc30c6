"""Pack groups of trajectories into one loss-masked `TrainingBatch`.

Legend: S = sequences in the batch, T = total tokens (sum of lengths).
Sequence i spans `[offsets[i], offsets[i] + lengths[i])` of the flat token arrays.
Padding sequences (partial-group policy `pad`) are loss-masked copies of the group's samples,
with the group's mean reward, so they change no gradient and no group mean.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stacx.schemas.records import TrainingBatch, Trajectory

__all__ = ["PackedGroup", "batch_id", "pack_batch"]

PAD_SEPARATOR = "#pad"


@dataclass(kw_only=True, slots=True)
class PackedGroup:
    """The decoded samples of one group, ready to pack."""

    group_id: str
    trajectories: list[Trajectory]
    """Trainable samples in sample-index order."""
    group_size: int = 0
    """Expected samples per group; fewer trainable ones make the group partial."""
    pad_to: int = 0
    """Total sequences after padding (0: none)."""
    flagged_ids: frozenset[str] = frozenset()
    """Failed samples kept by the failure policy."""


def batch_id(trajectory_ids: Sequence[str]) -> str:
    """Deterministic batch id: the same members always give the same id, in any order."""
    joined = "\x1f".join(sorted(trajectory_ids))
    return hashlib.sha256(joined.encode()).hexdigest()[:32]


@dataclass(kw_only=True, slots=True)
class _Row:
    trajectory: Trajectory
    trajectory_id: str
    group_id: str
    reward: float
    masked: bool


def _rows(group: PackedGroup, *, mask_flagged: bool) -> list[_Row]:
    rows = [
        _Row(
            trajectory=t,
            trajectory_id=t.trajectory_id,
            group_id=group.group_id,
            reward=float(t.reward),
            masked=mask_flagged and t.trajectory_id in group.flagged_ids,
        )
        for t in group.trajectories
    ]
    mean_reward = float(np.mean([r.reward for r in rows])) if rows else 0.0
    for k in range(max(0, group.pad_to - len(rows))):
        source = group.trajectories[k % len(group.trajectories)]
        rows.append(
            _Row(
                trajectory=source,
                trajectory_id=f"{source.trajectory_id}{PAD_SEPARATOR}{k}",
                group_id=group.group_id,
                reward=mean_reward,
                masked=True,
            )
        )
    return rows


def pack_batch(
    groups: Sequence[PackedGroup], *, model_name: str, mask_flagged: bool = False
) -> TrainingBatch:
    """Concatenate the groups' sequences into one batch (groups and samples keep their order)."""
    rows = [row for group in groups for row in _rows(group, mask_flagged=mask_flagged)]
    if not rows:
        raise ValueError("pack_batch needs at least one sequence")
    lengths = np.array([len(r.trajectory.token_ids) for r in rows], dtype=np.int32)  # [S]
    offsets = np.zeros(len(rows), dtype=np.int32)  # [S]
    np.cumsum(lengths[:-1], out=offsets[1:])
    masks = [np.zeros_like(r.trajectory.loss_mask) if r.masked else r.trajectory.loss_mask
             for r in rows]
    ids = [r.trajectory_id for r in rows]
    return TrainingBatch(
        batch_id=batch_id(ids),
        model_name=model_name,
        trajectory_ids=ids,
        group_ids=[r.group_id for r in rows],
        task_types=[r.trajectory.task_type for r in rows],
        policy_versions=np.array([r.trajectory.policy_version for r in rows], dtype=np.int32),
        offsets=offsets,
        lengths=lengths,
        prompt_lengths=np.array([r.trajectory.prompt_length for r in rows], dtype=np.int32),
        token_ids=np.concatenate([r.trajectory.token_ids for r in rows]).astype(np.int32),  # [T]
        loss_mask=np.concatenate(masks).astype(np.uint8),  # [T]
        logprobs=np.concatenate([_logprobs(r.trajectory) for r in rows]).astype(np.float32),
        rewards=np.array([r.reward for r in rows], dtype=np.float32),  # [S]
        temperatures=np.array([r.trajectory.temperature for r in rows], dtype=np.float32),  # [S]
        logprobs_recorded=np.array([_has_logprobs(r.trajectory) for r in rows], dtype=np.uint8),
        teacher_logprobs=_teacher_logprobs([r.trajectory for r in rows]),
        metadata=_metadata(groups, rows),
    )


def _teacher_logprobs(trajectories: Sequence[Trajectory]) -> np.ndarray | None:
    """[T] teacher logprobs where a served teacher scored tokens (0 elsewhere); None if none did."""
    scored = [len(t.teacher_logprobs) == len(t.token_ids) > 0 for t in trajectories]
    if not any(scored):
        return None
    return np.concatenate([
        np.asarray(t.teacher_logprobs, dtype=np.float32) if ok
        else np.zeros(len(t.token_ids), dtype=np.float32)
        for t, ok in zip(trajectories, scored, strict=True)
    ])


def _has_logprobs(trajectory: Trajectory) -> bool:
    return len(trajectory.logprobs) == len(trajectory.token_ids)


def _logprobs(trajectory: Trajectory) -> np.ndarray:
    if _has_logprobs(trajectory):
        return trajectory.logprobs
    return np.zeros(len(trajectory.token_ids), dtype=np.float32)


def _metadata(groups: Sequence[PackedGroup], rows: Sequence[_Row]) -> dict[str, str]:
    flagged = sorted(tid for g in groups for tid in g.flagged_ids)
    padded = [r.trajectory_id for r in rows if PAD_SEPARATOR in r.trajectory_id]
    partial = [g.group_id for g in groups if len(g.trajectories) < g.group_size]
    meta = {"num_groups": str(len(groups))}
    if flagged:
        meta["flagged"] = ",".join(flagged)
    if padded:
        meta["padded"] = ",".join(padded)
    if partial:
        meta["partial_groups"] = ",".join(partial)
    return meta
