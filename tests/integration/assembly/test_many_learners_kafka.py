"""Many consumers on one stream: the assembler (feeding a GRPO trainer), a reward-model learner
and an SFT rejection-sampling learner read one trajectories topic at once, each in its own
group; each sees every trajectory exactly once and commits. Kafka's ConsumerGroupCommand shows
all of them with lag 0, and the weight subscriber's group next to them."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from assembly_worker import STOPPED_BY_SIGTERM, AssemblerProcess, consume_records
from confluent_kafka import Producer

from stacx.consumers.assembly.testing import make_trajectory
from stacx.consumers.learner_feed import KeepRule, LearnerFeed
from stacx.consumers.weights import WeightSubscriber, subscriber_group
from stacx.infra.services import kafka_tools
from stacx.schemas.codec import encode
from stacx.schemas.records import Trajectory, TrajectoryStatus, WeightVersion

NUM_GROUPS, GROUP_SIZE = 4, 4


def _trajectories() -> list[Trajectory]:
    out = []
    for g in range(NUM_GROUPS):
        for s in range(GROUP_SIZE):
            failed = (g + s) % 4 == 3
            status = TrajectoryStatus.FAILED if failed else TrajectoryStatus.COMPLETED
            out.append(make_trajectory(f"g{g}", s, status=status, reward=0.0 if failed or s % 2 else 1.0))
    return out


def _feed(feed: LearnerFeed, total: int, seen: list[str], kept: list[str]) -> None:
    with feed:
        while feed.num_seen < total:
            kept += [t.trajectory_id for t in feed.read(100, 0.5)]
            feed.commit()
        seen += [str(i) for i in range(feed.num_seen)]


def test_three_learners_each_read_every_trajectory_once(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, app_ids: list[str]
) -> None:
    run = uuid.uuid4().hex[:8]
    topic, batches, weights = (
        fresh_topic("many-traj", partitions=4),
        fresh_topic("many-b"),
        fresh_topic("many-w"),
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    producer.produce(
        weights, key=b"policy", value=encode(WeightVersion(model_name="policy", version=0, path="/w"))
    )
    events = _trajectories()
    groups = {"grpo": f"stacx-assembler-{run}", "reward": f"stacx-reward-{run}", "sft": f"stacx-sft-{run}"}
    app_ids.append(groups["grpo"])
    config = {
        "app_id": groups["grpo"], "bootstrap_servers": kafka_bootstrap, "trajectories_topic": topic,
        "batches_topic": batches, "weights_topic": weights, "datadir": str(tmp_path / "data"),
        "tick_interval_s": 0.5, "grouping": {"group_size": GROUP_SIZE}, "mixture": {"batch_size": 1},
        "filtering": {"failure_policy": "flag"},
    }  # fmt: skip
    feeds = {
        name: LearnerFeed(
            LearnerFeed.Config(
                group_id=groups[name], topic=topic, bootstrap_servers=kafka_bootstrap, keep=keep
            )
        )  # fmt: skip
        for name, keep in (("reward", KeepRule.ALL), ("sft", KeepRule.SUCCESSFUL))
    }
    read: dict[str, tuple[list[str], list[str]]] = {name: ([], []) for name in feeds}
    with AssemblerProcess(config, tmp_path) as assembler:
        assembler.wait_for_line("latest weights policy=0")
        threads = [
            threading.Thread(target=_feed, args=(feeds[n], len(events), *read[n]), daemon=True) for n in feeds
        ]
        for t in threads:
            t.start()
        for t in events:
            producer.produce(topic, key=t.group_id.encode(), value=encode(t))
        assert producer.flush(30) == 0
        consume_records(kafka_bootstrap, batches, NUM_GROUPS)
        for t in threads:
            t.join(timeout=60)
        code, stats = assembler.stop()
    assert code == STOPPED_BY_SIGTERM and stats["trajectories"] == len(events)
    successful = {
        t.trajectory_id for t in events if t.status is TrajectoryStatus.COMPLETED and t.reward >= 1.0
    }
    assert len(read["reward"][0]) == len(events) and Counter(read["reward"][1]) == Counter(
        t.trajectory_id for t in events
    )
    assert len(read["sft"][0]) == len(events) and sorted(read["sft"][1]) == sorted(successful)

    subscriber = WeightSubscriber(
        WeightSubscriber.Config(
            model_name="critic",
            server_url="http://127.0.0.1:1",
            bootstrap_servers=kafka_bootstrap,
            topic=weights,
        )
    )
    subscriber.catch_up()  # reads the policy's version (not its model) and commits
    subscriber.close()
    rows = kafka_tools.describe_groups(kafka_bootstrap, list(groups.values()))
    on_topic = [r for r in rows if r["TOPIC"] == topic]
    committed = Counter()
    for r in on_topic:
        assert r["LAG"] == "0", r
        committed[r["GROUP"]] += int(r["CURRENT-OFFSET"])
    assert committed == {g: len(events) for g in groups.values()}
    assert {*groups.values(), subscriber_group("critic", "http://127.0.0.1:1", weights)} <= set(
        kafka_tools.consumer_groups(kafka_bootstrap)
    )
