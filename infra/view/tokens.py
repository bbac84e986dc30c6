"""Where each turn's tokens lie in a trajectory's token sequence, so a page can show the
sequence turn by turn with every token exactly once (and coloured by its loss mask)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stacx.schemas.records import Trajectory

__all__ = ["TokenSpan", "turn_spans"]


@dataclass(frozen=True, slots=True)
class TokenSpan:
    """Positions [start, end) of the trajectory's token sequence."""

    start: int
    end: int
    turn: int | None
    """Index of the turn these tokens are (None: prompt or template tokens between turns)."""


def _find(sequence: Sequence[int], part: Sequence[int], start: int) -> int:
    """First position >= start where `part` occurs in `sequence` (-1: nowhere)."""
    n, m = len(sequence), len(part)
    first = part[0]
    for pos in range(start, n - m + 1):
        if sequence[pos] == first and list(sequence[pos : pos + m]) == list(part):
            return pos
    return -1


def turn_spans(trajectory: Trajectory) -> list[TokenSpan]:
    """The token sequence cut into consecutive spans covering it whole: each turn's own tokens
    where they occur in order, and the tokens between them. A turn whose tokens are not found
    in order (a scaffold that re-tokenized) gets no span; its tokens count in the spans around."""
    sequence = [int(t) for t in trajectory.token_ids]
    spans: list[TokenSpan] = []
    cursor = 0
    for index, turn in enumerate(trajectory.turns):
        part = [int(t) for t in turn.token_ids]
        if not part:
            continue
        pos = _find(sequence, part, cursor)
        if pos < 0:
            continue
        if pos > cursor:
            spans.append(TokenSpan(cursor, pos, None))
        spans.append(TokenSpan(pos, pos + len(part), index))
        cursor = pos + len(part)
    if cursor < len(sequence):
        spans.append(TokenSpan(cursor, len(sequence), None))
    return spans
