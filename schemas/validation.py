"""Invariants of records: checked by producers before publishing and by consumers before
handing records out.

A producer refuses a record that breaks them (`RecordValidationError` naming the field); a
consumer sends one that still arrives (an older or foreign writer) to the dead-letter topic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sized

import numpy as np

from stacx.schemas.errors import RecordValidationError
from stacx.schemas.records import AgentInteraction, Feedback, TrainingBatch, Trajectory

__all__ = ["record_problems", "validate"]


_squares = np.vdot
_isfinite = math.isfinite


def _all_finite(values: object) -> bool:
    """Fast check: True means every entry is finite; False may still mean all finite.

    The sum of squares (a BLAS dot product, in the array's own dtype) is finite when every
    entry is (NaN and +-inf propagate); it may overflow on large finite entries, which only
    sends the caller to the exact check (BLAS sets no numpy warning). Half the cost of
    `np.add.reduce`, whose call alone costs more than the dot of 2,000 floats, aligned or not.
    Integers are always finite.
    """
    if type(values) is np.ndarray and values.dtype.kind == "f":  # the common case, first
        return _isfinite(_squares(values, values))  # an empty array gives 0.0
    if isinstance(values, float | int):
        return math.isfinite(values)
    array = np.asarray(values)
    kind = array.dtype.kind
    if kind in "biu" or array.size == 0:
        return True
    return kind == "f" and math.isfinite(np.add.reduce(array, axis=None))


def _non_finite(name: str, values: object) -> list[str]:
    """`name` holds NaN or +-inf (the first bad entries shown), or nothing."""
    if _all_finite(values):
        return []
    array = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array))
    if not len(bad):
        return []
    shown = ", ".join(f"[{i}]={array.flat[i]}" for i in bad[:3])
    return [f"{name} must be finite, got {shown}{' ...' if len(bad) > 3 else ''}"]


def _non_finite_map(name: str, values: Mapping[str, float]) -> list[str]:
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    return [f"{name} must be finite, got {bad}"] if bad else []


def _finite(fields: Iterable[tuple[str, object]]) -> list[str]:
    return [p for name, values in fields if values is not None for p in _non_finite(name, values)]


def _trajectory_ok(t: Trajectory) -> bool:
    """The common case in one pass: every invariant of `_trajectory` holds."""
    n = len(t.token_ids)
    return (
        bool(t.trajectory_id)
        and len(t.loss_mask) == n
        and len(t.logprobs) == n
        and 0 <= t.prompt_length <= n
        and t.sample_index >= 0
        and math.isfinite(t.reward)
        and math.isfinite(t.temperature)
        and _all_finite(t.logprobs)
        and all(map(math.isfinite, t.rewards.values()))
    )


def _trajectory(t: Trajectory) -> list[str]:
    try:
        if _trajectory_ok(t):
            return []
    except TypeError:  # a field of the wrong type (None): the full check below names it
        pass
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
    problems += _finite([("reward", t.reward), ("logprobs", t.logprobs), ("temperature", t.temperature)])
    return problems + _non_finite_map("rewards", t.rewards)


def _interaction(a: AgentInteraction) -> list[str]:
    n = len(a.token_ids)
    problems = _finite([("logprobs", a.logprobs)])
    if len(a.loss_mask) != n or len(a.logprobs) != n:
        problems.insert(
            0,
            f"token_ids ({n}), loss_mask ({len(a.loss_mask)}) and logprobs "
            f"({len(a.logprobs)}) must have the same length",
        )
    return problems


def _feedback(f: Feedback) -> list[str]:
    return _finite([("reward", f.reward)]) + _non_finite_map("components", f.components)


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
    if b.teacher_logprobs is not None and len(b.teacher_logprobs) != n:
        problems.append(f"teacher_logprobs has {len(b.teacher_logprobs)} entries, expected {n}")
    if not problems and k and int((b.offsets + b.lengths).max()) > n:
        problems.append("a sequence extends past the end of token_ids")
    return problems + _finite(
        [
            ("rewards", b.rewards),
            ("logprobs", b.logprobs),
            ("advantages", b.advantages),
            ("temperatures", b.temperatures),
            ("teacher_logprobs", b.teacher_logprobs),
        ]
    )


_CHECKS: dict[type, Callable[[object], list[str]]] = {
    Trajectory: _trajectory,  # type: ignore[dict-item]
    AgentInteraction: _interaction,  # type: ignore[dict-item]
    Feedback: _feedback,  # type: ignore[dict-item]
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
