"""Pipeline config parsing, run layout and the per-service config sections."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.pipeline.config import PipelineConfigError, load_spec, parse_spec
from infra.pipeline.layout import (
    RunLayout,
    RunTopics,
    assembler_section,
    rollout_section,
    trainer_section,
)

REPO = Path(__file__).resolve().parents[3]


def test_quickstart_yaml_parses_and_every_service_section_builds() -> None:
    from consumers.assembly import AssemblerApp
    from infra.config import build
    from rollout.config import parse_config
    from trainer.config import TrainerConfig, from_mapping

    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    layout = RunLayout.create(spec, now=0.0)
    model = REPO / "runs" / "does-not-matter"
    rollout = parse_config(rollout_section(spec, layout, model_dir=model,
                                           inference_url="http://127.0.0.1:1",
                                           gateway_url="http://127.0.0.1:2"))
    assert rollout.kafka.trajectories_topic == layout.topics.trajectories
    assembler = build(AssemblerApp.Config, assembler_section(spec, layout)["assembler"],
                      where="assembler")
    assert assembler.batches_topic == layout.topics.batches
    assert assembler.grouping.group_size == rollout.data.samples_per_task
    section = trainer_section(spec, layout, model_dir=model)
    section["models"]["policy"] = {"tiny": {}}  # the model dir does not exist in a unit test
    trainer = from_mapping(TrainerConfig, section)
    assert trainer.max_steps == spec.pipeline.steps
    assert trainer.export.topic == layout.topics.weights == rollout.kafka.weights_topic


def test_unknown_fields_are_named() -> None:
    with pytest.raises(PipelineConfigError, match=r"pipeline.sft: unknown field\(s\) stpes;"):
        parse_spec({"pipeline": {"sft": {"stpes": 3}}})
    with pytest.raises(PipelineConfigError, match="unknown section"):
        parse_spec({"pipelines": {}})


def test_wrong_types_and_values_are_rejected() -> None:
    with pytest.raises(PipelineConfigError, match="pipeline.steps must be int"):
        parse_spec({"pipeline": {"steps": "many"}})
    with pytest.raises(PipelineConfigError, match="pipeline.steps=0"):
        parse_spec({"pipeline": {"steps": 0}})
    with pytest.raises(PipelineConfigError, match="pipeline.name"):
        parse_spec({"pipeline": {"name": "../escape"}})


def test_ints_are_accepted_for_floats() -> None:
    spec = parse_spec({"pipeline": {"sft": {"lr": 1}}})
    assert spec.pipeline.sft.lr == 1.0 and isinstance(spec.pipeline.sft.lr, float)


def test_fresh_topics_are_per_run_and_keep_the_standard_configs() -> None:
    fresh = RunTopics.for_run("demo-1", fresh=True)
    assert fresh.batches == "stacx.batches.demo-1"
    specs = {s.name: s for s in fresh.specs()}
    assert specs["stacx.weights.demo-1"].config["cleanup.policy"] == "compact"
    assert specs["stacx.trajectories.demo-1"].partitions == 8
    standard = RunTopics.for_run("demo-1", fresh=False)
    assert standard.trajectories == "stacx.trajectories"


def test_layout_uses_a_run_specific_model_name_on_shared_topics() -> None:
    spec = parse_spec({"pipeline": {"name": "x", "fresh_topics": False}})
    layout = RunLayout.create(spec, now=0.0)
    assert layout.run_id == "x-19700101-000000"
    assert layout.model_name == layout.run_id
    assert layout.root == Path("runs") / "x"


def test_sections_override_the_run_values_but_keep_the_rest() -> None:
    spec = parse_spec({"rollout": {"manager": {"max_staleness": 3, "model_name": "other"}},
                       "trainer": {"recipe": "dr_grpo", "source": {"poll_timeout_s": 0.5}}})
    layout = RunLayout.create(spec, now=0.0)
    rollout = rollout_section(spec, layout, model_dir=Path("m"), inference_url="i",
                              gateway_url="g")
    assert rollout["manager"] == {"max_staleness": 3, "model_name": "policy"}
    trainer = trainer_section(spec, layout, model_dir=Path("m"))
    assert trainer["recipe"] == "dr_grpo"
    assert trainer["source"]["poll_timeout_s"] == 0.5
    assert trainer["source"]["topic"] == layout.topics.batches
    assert spec.rollout["manager"]["model_name"] == "other"  # the spec itself is not mutated


def test_a_restarted_trainer_resumes_from_its_checkpoint_by_default() -> None:
    """Break 1: the run's trainer config used to say `checkpoint.resume: false`, so a restarted
    trainer began at step 1 from the initial weights while reading from the committed offsets."""
    from trainer.config import TrainerConfig, from_mapping

    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    layout = RunLayout.create(spec, now=0.0)
    section = trainer_section(spec, layout, model_dir=Path("m"))
    section["models"]["policy"] = {"tiny": {}}
    config = from_mapping(TrainerConfig, section)
    assert config.checkpoint.resume is True
    assert config.checkpoint.dir == str(layout.checkpoints_dir.resolve())
    opted_out = parse_spec({"trainer": {"checkpoint": {"resume": False}}})
    assert trainer_section(opted_out, layout, model_dir=Path("m"))["checkpoint"]["resume"] is False


def test_the_rollout_service_reads_the_run_tasks_through_a_consumer_group() -> None:
    """A restarted rollout service must go on from its committed tasks, not from the first one."""
    from infra.pipeline.tasks import task_order
    from rollout.config import parse_config

    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    layout = RunLayout.create(spec, now=0.0)
    section = rollout_section(spec, layout, model_dir=Path("m"), inference_url="i", gateway_url="g")
    data = parse_config(section, where="test").data
    assert data.topic == layout.topics.tasks == f"stacx.tasks.{layout.run_id}" and data.path is None
    assert data.consumer_group == f"stacx-rollout-{layout.run_id}"
    assert layout.topics.tasks in {t.name for t in layout.topics.specs()}
    rows = [{"task_id": str(i)} for i in range(5)]
    order = task_order(rows, passes=2, seed=3)
    assert len(order) == 10 and sorted(r["task_id"] for r in order[:5]) == ["0", "1", "2", "3", "4"]
    assert order == task_order(rows, passes=2, seed=3)
