"""Helpers for the event-plane integration tests."""

from __future__ import annotations

import time

from stacx.consumers import ConsumedEvent, EventConsumer
from stacx.schemas.records import Trajectory

SAFETY_TIMEOUT_S = 60.0
"""Upper bound on waiting for events, so a broken test fails instead of hanging."""


def trajectory(i: int, group: str = "g", **kw: object) -> Trajectory:
    return Trajectory(
        trajectory_id=f"traj-{i:06d}",
        group_id=f"{group}-{i % 16}",
        sample_index=i,
        task_id=f"task-{i}",
        task_type="unit",
        model_name="m",
        policy_version=1,
        **kw,
    )  # type: ignore[arg-type]


def consumer(bootstrap: str, group: str, topic: str, dlq: str | None, **kw: object) -> EventConsumer:
    return EventConsumer(
        EventConsumer.Config(bootstrap_servers=bootstrap, group_id=group, topics=[topic], dlq_topic=dlq, **kw)
    )  # type: ignore[arg-type]


def collect(source: EventConsumer, count: int, settle_s: float = 1.0) -> list[ConsumedEvent]:
    """Read until `count` events arrived, then keep polling `settle_s` to catch any extra ones."""
    events: list[ConsumedEvent] = []
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while len(events) < count and time.monotonic() < deadline:
        events += source.consume(1000, timeout=0.5)
    settle = time.monotonic() + settle_s
    while time.monotonic() < settle:
        events += source.consume(1000, timeout=0.2)
    return events
