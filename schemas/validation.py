"""Invariants of decoded records, checked by consumers before handing records out.

A record that fails them goes to the dead-letter topic instead of into training.
"""

from __future__ import annotations

from collections.abc import Callable, Sized

from schemas.errors import RecordValidationError
from schemas.records import AgentInteraction, TrainingBatch, Trajectory

__all__ = ["record_problems", "validate"]


def _trajectory(t: Trajectory) -> list[str]:
    problems = []
    if not t.trajectory_id:
        problems.append("trajectory_id is empty")
    n = len(t.token_ids)
    if len(t.loss_mask) != n or len(t.logprobs) != n:
        problems.append(
            f"token_ids ({n}), loss_mask ({len(t.loss_mask)}) and logprobs ({len(t.logprobs)}) "
            "must have the same length"
        )
    if not 0 <= t.prompt_length <= n:
        problems.append(f"prompt_length {t.prompt_length} outside [0, {n}]")
    if t.sample_index < 0:
        problems.append(f"sample_index {t.sample_index} is negative")
    return problems


def _interaction(a: AgentInteraction) -> list[str]:
    n = len(a.token_ids)
    if len(a.loss_mask) != n or len(a.logprobs) != n:
        return [
            f"token_ids ({n}), loss_mask ({len(a.loss_mask)}) and logprobs "
            f"({len(a.logprobs)}) must have the same length"
        ]
    return []


def _batch(b: TrainingBatch) -> list[str]:
    problems = []
    k = len(b.trajectory_ids)
    per_sequence: dict[str, Sized] = {
        "group_ids": b.group_ids,
        "task_types": b.task_types,
        "policy_versions": b.policy_versions,
        "offsets": b.offsets,
        "lengths": b.lengths,
        "prompt_lengths": b.prompt_lengths,
        "rewards": b.rewards,
    }
    problems += [
        f"{name} has {len(v)} entries, expected {k}" for name, v in per_sequence.items() if len(v) != k
    ]
    n = len(b.token_ids)
    if len(b.loss_mask) != n or len(b.logprobs) != n:
        problems.append(f"token_ids ({n}), loss_mask and logprobs must have the same length")
    if not problems and k and int((b.offsets + b.lengths).max()) > n:
        problems.append("a sequence extends past the end of token_ids")
    return problems


_CHECKS: dict[type, Callable[[object], list[str]]] = {
    Trajectory: _trajectory,  # type: ignore[dict-item]
    AgentInteraction: _interaction,  # type: ignore[dict-item]
    TrainingBatch: _batch,  # type: ignore[dict-item]
}


def record_problems(record: object) -> list[str]:
    """Every broken invariant of `record` (empty when valid or when its type has none)."""
    check = _CHECKS.get(type(record))
    return check(record) if check else []


def validate(record: object) -> None:
    """Raise RecordValidationError listing every broken invariant of `record`."""
    problems = record_problems(record)
    if problems:
        raise RecordValidationError(type(record).__name__, problems)
