"""A consumer group that has joined but committed nothing, as a service stopped before its first
commit leaves it: `stacx topics describe` / `gc --run` must still count it as the run's."""

from __future__ import annotations

import time

from stacx.infra.services import topic_admin


def assert_describe_finds_idle_group(bootstrap: str, run_id: str, group: str, topic: str) -> None:
    """Join `group` on `topic` without committing, check that the run's description lists it,
    then delete the run."""
    from confluent_kafka import Consumer

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    reader.subscribe([topic])
    deadline = time.monotonic() + 60  # an upper bound on joining, not a timing assertion
    while not reader.assignment() and time.monotonic() < deadline:
        reader.poll(0.5)
    try:
        summary, _ = topic_admin.describe(bootstrap, run_id)
        assert group in summary.groups
    finally:
        reader.close()
        topic_admin.delete_run(bootstrap, run_id)
