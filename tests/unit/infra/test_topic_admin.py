"""Which run a topic or consumer group belongs to (`stacx topics`)."""

from __future__ import annotations

from stacx.infra.services.topic_admin import TopicInfo, run_of, runs


def test_run_topics_name_their_run_and_workers_belong_to_the_longest_known_run() -> None:
    assert run_of("stacx.trajectories.quick-20261130-120000") == "quick-20261130-120000"
    assert run_of("stacx.agent-logs.r1") == "r1"
    assert run_of("stacx.trajectories") is None
    assert run_of("stacx.oncall.trajectories.r2") == "r2"  # the on-call demo's join output
    assert run_of("stacx.oncall.trajectories") is None
    assert run_of("stacx-oncall-learner-r2", ["r2"]) == "r2"
    known = ["quick-1", "quick-1-b"]
    assert run_of("stacx-assembler-quick-1-b-ticks", known) == "quick-1-b"
    assert run_of("stacx-assembler-quick-1-pool-changelog", known) == "quick-1"
    assert run_of("stacx-rollout-weights-quick-1", known) == "quick-1"
    assert run_of("stacx-assembler-other-ticks", known) is None


def test_runs_gather_topics_and_groups() -> None:
    infos = [
        TopicInfo(name="stacx.batches.r1", run="r1", partitions=1, records=3, size_bytes=10),
        TopicInfo(name="stacx-assembler-r1-ticks", run="r1", partitions=4, records=7, size_bytes=5),
        TopicInfo(name="stacx.dlq", run=None, partitions=1, records=1, size_bytes=1),
    ]
    (r1,) = runs(infos, groups=["stacx-trainer-r1", "stacx-monitor-x"])
    assert (r1.records, r1.size_bytes, r1.groups) == (10, 15, ["stacx-trainer-r1"])
