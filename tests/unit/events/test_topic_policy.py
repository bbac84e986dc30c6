"""`TopicPolicy`: replication, partitions, retention and compression of every topic STACX creates."""

from __future__ import annotations

import pytest

from stacx.infra.config import ConfigError, build
from stacx.infra.pipeline.config import parse_spec
from stacx.infra.pipeline.layout import RunTopics
from stacx.schemas import topics
from stacx.schemas.topics import TopicPolicy, policy_specs


def test_single_node_defaults_cap_retention_and_never_recompress() -> None:
    specs = {s.name: s for s in policy_specs(TopicPolicy())}
    trajectories = specs[topics.TRAJECTORIES]
    assert trajectories.replication_factor == 1 and trajectories.partitions == 8
    assert trajectories.config["compression.type"] == "producer"
    assert int(trajectories.config["retention.ms"]) == 30 * 24 * 3600 * 1000
    assert int(trajectories.config["retention.bytes"]) > 0
    weights = specs[topics.WEIGHTS]  # compacted: the latest version per key stays, whatever its age
    assert weights.config["cleanup.policy"] == "compact" and "retention.ms" not in weights.config


def test_cluster_policy_replicates_and_sets_min_insync() -> None:
    spec = TopicPolicy.cluster().apply(topics.spec_for("schemas"))
    assert spec.replication_factor == 3 and spec.config["min.insync.replicas"] == "2"


def test_partitions_by_kind_reach_a_runs_own_topics() -> None:
    policy = TopicPolicy(partitions={"trajectories": 2}, compression="zstd")
    specs = {s.name: s for s in RunTopics.for_run("r1", fresh=True).specs(policy)}
    assert specs["stacx.trajectories.r1"].partitions == 2
    assert specs["stacx.batches.r1"].partitions == 1
    assert {s.config["compression.type"] for s in specs.values()} == {"zstd"}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"replication_factor": 0}, "replication_factor"),
        ({"min_insync_replicas": 2}, "min_insync_replicas"),
        ({"retention_ms": 0}, "retention_ms"),
        ({"compression": "brotli"}, "compression"),
        ({"partitions": {"trajectorys": 4}}, "partitions"),
    ],
)
def test_bad_settings_name_the_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=rf"topics(\.|: ){named}"):
        build(TopicPolicy, fields, where="topics")


def test_pipeline_file_topics_section_feeds_the_assembler() -> None:
    tree = {
        "pipeline": {"model": {"tiny": {}}, "tasks": {"topic": "stacx.tasks"}},
        "topics": {"replication_factor": 3, "min_insync_replicas": 2},
    }
    spec = parse_spec(tree, check=False)
    assert spec.topics.replication_factor == 3
    from stacx.infra.pipeline.layout import RunLayout, assembler_section

    section = assembler_section(spec, RunLayout.create(spec, now=0.0))["assembler"]
    assert section["topic_policy"]["replication_factor"] == 3
