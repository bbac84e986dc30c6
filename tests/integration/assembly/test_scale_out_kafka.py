"""Two `stacx assemble` workers in one group: the one that runs the batch stage (the groups
topic's single partition) takes 3 of the 8 trajectories partitions and the other 5, every
co-partitioned topic follows its trajectories partition, and every group still makes one batch.

The assignment is read from the broker (the consumer group's members), not from the worker.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from assembly_worker import STOPPED_BY_SIGTERM, AssemblerProcess, consume_records, one_group_config
from confluent_kafka import ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient

from stacx.consumers.assembly.testing import make_trajectory
from stacx.schemas.codec import encode

PARTITIONS = 8


def _stable_assignment(
    bootstrap: str, group: str, members: int, timeout_s: float = 180.0
) -> list[dict[str, set[int]]]:
    """Each member's topic -> partitions once the group is stable with `members` members."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    found: Any = None
    while time.monotonic() < deadline:
        found = admin.describe_consumer_groups([group])[group].result(timeout=10)
        if found.state == ConsumerGroupState.STABLE and len(found.members) == members:
            assignments = []
            for member in found.members:
                topics: dict[str, set[int]] = {}
                for tp in member.assignment.topic_partitions:
                    topics.setdefault(tp.topic, set()).add(tp.partition)
                assignments.append(topics)
            return assignments
        time.sleep(1.0)
    raise AssertionError(f"group {group} never became stable with {members} members: {found}")


@pytest.mark.parametrize("standbys", [0, 1])
def test_the_batch_stage_worker_gets_fewer_trajectories_partitions(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str], standbys: int
) -> None:
    config = one_group_config(fresh_topic, kafka_bootstrap, tmp_path, "scale", partitions=PARTITIONS)
    config["standby_replicas"] = standbys
    app_ids.append(config["app_id"])
    traj_topic, groups_topic = config["trajectories_topic"], f"{config['app_id']}-groups"
    ticks_topic = f"{config['app_id']}-ticks"
    with (
        AssemblerProcess({**config, "datadir": str(tmp_path / "a")}, tmp_path / "a") as first,
        AssemblerProcess({**config, "datadir": str(tmp_path / "b")}, tmp_path / "b") as second,
    ):
        members = _stable_assignment(kafka_bootstrap, config["app_id"], 2)
        (stage2,) = [m for m in members if groups_topic in m]
        (other,) = [m for m in members if groups_topic not in m]
        assert len(stage2[traj_topic]) == 3 and len(other[traj_topic]) == 5, members
        assert stage2[traj_topic] | other[traj_topic] == set(range(PARTITIONS))
        for member in members:  # the ticks topic is co-partitioned: it follows
            assert member[ticks_topic] == member[traj_topic], members
        changelog = f"{config['app_id']}-groups-changelog"
        for member, peer in ((stage2, other), (other, stage2)):  # a standby mirrors the peer's
            assert member[changelog] == member[traj_topic] | (peer[traj_topic] if standbys else set())

        producer = Producer({"bootstrap.servers": kafka_bootstrap, "compression.type": "lz4"})
        groups = [f"g{n}" for n in range(16)]
        for group in groups:
            for i in range(2):
                producer.produce(traj_topic, key=group.encode(), value=encode(make_trajectory(group, i)))
        assert producer.flush(30) == 0
        batches = consume_records(kafka_bootstrap, config["batches_topic"], len(groups), idle_s=3.0)
        assert first.stop()[0] == STOPPED_BY_SIGTERM and second.stop()[0] == STOPPED_BY_SIGTERM
    packed = Counter(g for _, batch, _ in batches for g in set(batch.group_ids))
    assert packed == Counter(groups)
