"""The join's event-time clock: when a partition's feedback windows may end.

Windows end on event time, never on the worker's own clock alone: a worker that lags or was down
reads hours-old calls and their feedback after the wall clock passed their windows, and closing
windows by the wall clock would throw away feedback that was on time. Per partition, each input
(agent logs, feedback) has a clock: the wall clock when nothing is left to read on it (the
input's next offset is its end in Kafka), else the newest `created_at_ms` it delivered. The
partition's watermark is the slowest input's clock less `grace_ms` (events of one input arrive
slightly out of order: several producers, retries); a window ending before the watermark is over.
An input whose position is unknown and that delivered nothing yet holds the watermark back.
"""

from __future__ import annotations

__all__ = ["EventClock"]


class EventClock:
    """Newest event time and caught-up state per (partition, input topic)."""

    def __init__(self, inputs: tuple[str, ...], *, grace_ms: int) -> None:
        if grace_ms < 0:
            raise ValueError(f"grace {grace_ms} ms: use a non-negative grace period")
        self.inputs = inputs
        self.grace_ms = grace_ms
        self._newest: dict[tuple[int, str], int] = {}
        self._caught_up: dict[tuple[int, str], bool] = {}

    def observe(self, partition: int, topic: str, event_ms: int) -> None:
        """An event of `topic[partition]` created at `event_ms` was processed."""
        where = (partition, topic)
        self._newest[where] = max(event_ms, self._newest.get(where, event_ms))

    def caught_up(self, partition: int, topic: str, value: bool) -> None:
        """Whether every record `topic[partition]` holds now was processed."""
        self._caught_up[(partition, topic)] = value

    def watermark(self, partition: int, wall_ms: int) -> int | None:
        """Windows of `partition` ending before this are over; None: nothing can end yet."""
        clocks: list[int] = []
        for topic in self.inputs:
            where = (partition, topic)
            if self._caught_up.get(where, False):
                clocks.append(max(wall_ms, self._newest.get(where, wall_ms)))
            elif where in self._newest:
                clocks.append(self._newest[where])
            else:
                return None
        return min(clocks) - self.grace_ms
