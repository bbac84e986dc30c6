"""Pipeline config: the whole-file schema, the run layout, what the run fills in (only where the
user left a value empty), and the checks that run before anything starts."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacx.infra.pipeline.config import PipelineConfigError, load_spec, parse_spec
from stacx.infra.pipeline.layout import (
    RunLayout,
    RunTopics,
    assembler_section,
    rollout_section,
    trainer_section,
)
from stacx.infra.pipeline.resolve import check_resolved, explain, plan
from stacx.infra.pipeline.starter import STARTER_CONFIG

REPO = Path(__file__).resolve().parents[3]
MINIMAL: dict[str, Any] = {
    "pipeline": {"model": {"tiny": {}}, "tasks": {"source": "quickstart.arithmetic:ArithmeticTasks"},
                 "plugin_paths": [str(REPO / "examples")]},
    "rollout": {"data": {"samples_per_task": 4}},
}


def _tree(**sections: Any) -> dict[str, Any]:
    tree = copy.deepcopy(MINIMAL)
    for name, value in sections.items():
        if value is None:
            tree.pop(name, None)
        else:
            tree[name] = {**tree.get(name, {}), **value}
    return tree


def _errors(tree: dict[str, Any], **kwargs: Any) -> list[str]:
    with pytest.raises(PipelineConfigError) as info:
        parse_spec(tree, source="f.yaml", **kwargs)
    return str(info.value).splitlines()


def test_quickstart_yaml_parses_and_every_service_section_builds() -> None:
    from stacx.consumers.assembly import AssemblerApp
    from stacx.infra.config import build
    from stacx.rollout.config import RolloutConfig
    from stacx.trainer.config import TrainerConfig

    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    layout = RunLayout.create(spec, now=0.0)
    model = REPO / "runs" / "does-not-matter"
    rollout = build(
        RolloutConfig,
        rollout_section(
            spec,
            layout,
            model_dir=model,
            inference_url="http://127.0.0.1:1",
            gateway_url="http://127.0.0.1:2",
        ),
        where="config",
    )
    assert rollout.kafka.trajectories_topic == layout.topics.trajectories
    assert rollout.data.topic == layout.topics.tasks and rollout.data.path is None  # resumable tasks
    assembler = build(AssemblerApp.Config, assembler_section(spec, layout)["assembler"], where="assembler")
    assert assembler.batches_topic == layout.topics.batches
    assert assembler.grouping.group_size == rollout.data.samples_per_task
    section = trainer_section(spec, layout, model_dir=model)
    section["models"]["policy"] = {"tiny": {}}  # the model dir does not exist in a unit test
    trainer = build(TrainerConfig, section, where="trainer")
    assert trainer.max_steps == spec.pipeline.steps
    assert trainer.export.topic == layout.topics.weights == rollout.kafka.weights_topic
    check_resolved(spec)  # recipe, scaffolds, rewards, budget: all resolve


def test_every_shipped_pipeline_config_and_the_starter_parse() -> None:
    load_spec(REPO / "examples" / "quickstart.yaml")
    own = load_spec(REPO / "examples" / "own-tasks.yaml")
    assert own.pipeline.tasks.kind == "harbor" and own.pipeline.model.path
    scaffold = load_spec(REPO / "examples" / "scaffold_grpo" / "scaffold_grpo.yaml")
    assert scaffold.pipeline.tasks.kind == "harbor" and scaffold.pipeline.transcripts is not None
    check_resolved(scaffold)  # the transcripts render as mini-swe-agent's first call
    starter = parse_spec(yaml.safe_load(STARTER_CONFIG), source="starter")
    assert starter.pipeline.tasks.kind == "harbor" and starter.pipeline.sft is None


def test_unknown_fields_are_named_with_the_valid_ones() -> None:
    (line,) = _errors(_tree(pipeline={"sft": {"stpes": 3}}))
    assert line.startswith("f.yaml: pipeline.sft.stpes: unknown field; valid fields: batch_size, lr,")
    (line,) = _errors({**MINIMAL, "pipelines": {}})
    assert line.startswith("f.yaml: pipelines: unknown field; valid fields: assembler, bootstrap_servers")
    (line,) = _errors(_tree(trainer={"optimiser": {"lr": 1}}))
    assert line.startswith("f.yaml: trainer.optimiser: unknown field; valid fields: backend,")
    (line,) = _errors(_tree(rollout={"manager": {"evaluators": {"default": {"scafold": "x"}}}}))
    assert "rollout.manager.evaluators.default.scafold: unknown field" in line


def test_wrong_types_and_values_are_rejected_one_line_each() -> None:
    lines = _errors(_tree(pipeline={"steps": "many", "name": "../escape"}))
    assert "f.yaml: pipeline.steps: expected a valid integer, got 'many'" in lines
    assert any(line.startswith("f.yaml: pipeline.name: '../escape': use letters") for line in lines)
    assert len(lines) == 2
    (line,) = _errors(_tree(pipeline={"steps": 0}))
    assert line == "f.yaml: pipeline.steps: expected greater than or equal to 1, got 0"
    (line,) = _errors(_tree(trainer={"optimizer": {"lr": "fast"}}))
    assert line == "f.yaml: trainer.optimizer.lr: expected a valid number, got 'fast'"
    (line,) = _errors(_tree(trainer={"backend": {"kind": "tpu"}}))
    assert line.startswith("f.yaml: trainer.backend.kind: expected 'single' or 'fsdp2', got 'tpu'")


def test_model_and_tasks_are_required_and_exclusive() -> None:
    lines = _errors({"pipeline": {}})
    assert lines == [
        "f.yaml: pipeline.model: required field is missing",
        "f.yaml: pipeline.tasks: required field is missing",
    ]
    (line,) = _errors(_tree(pipeline={"tasks": {"harbor": "t", "jsonl": "t.jsonl"}}))
    assert "pipeline.tasks: set exactly one of source, harbor, jsonl, topic (got harbor, jsonl)" in line
    (line,) = _errors(_tree(pipeline={"model": {"path": "m", "tiny": {}}}))
    assert "pipeline.model: set exactly one of path" in line
    (line,) = _errors(_tree(pipeline={"tasks": {"harbor": "t"}, "sft": {}}))
    assert "pipeline: sft: harbor, jsonl or topic tasks warm-start on scaffold transcripts" in line
    (line,) = _errors(_tree(pipeline={"tasks": {"harbor": "t", "options": {"n": 1}}}))
    assert "pipeline.tasks: options are the keyword options of a task `source`; set `source` or drop" in line


def test_ints_are_accepted_for_floats() -> None:
    spec = parse_spec(_tree(pipeline={"sft": {"lr": 1}}))
    assert spec.pipeline.sft is not None
    assert spec.pipeline.sft.lr == 1.0 and isinstance(spec.pipeline.sft.lr, float)


def test_assignments_are_validated() -> None:
    spec = parse_spec(MINIMAL)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        spec.pipeline.steps = 0


def test_fresh_topics_are_per_run_and_keep_the_standard_configs() -> None:
    fresh = RunTopics.for_run("demo-1", fresh=True)
    assert fresh.batches == "stacx.batches.demo-1"
    specs = {s.name: s for s in fresh.specs()}
    assert specs["stacx.weights.demo-1"].config["cleanup.policy"] == "compact"
    assert specs["stacx.trajectories.demo-1"].partitions == 8
    standard = RunTopics.for_run("demo-1", fresh=False)
    assert standard.trajectories == "stacx.trajectories"


def test_layout_uses_a_run_specific_model_name_on_shared_topics() -> None:
    spec = parse_spec(_tree(pipeline={"name": "x", "fresh_topics": False}))
    layout = RunLayout.create(spec, now=0.0)
    assert layout.run_id == "x-19700101-000000"
    assert layout.model_name == layout.run_id
    assert layout.root == Path("runs") / "x"


def test_user_values_are_kept_and_only_empty_ones_filled() -> None:
    spec = parse_spec(
        _tree(
            rollout={"manager": {"max_staleness": 3}, "kafka": {"bootstrap_servers": "k:1"}},
            trainer={
                "recipe": "dr_grpo",
                "source": {"poll_timeout_s": 0.5, "group_id": "mine"},
                "checkpoint": {"dir": "/ckpt", "resume": True},
                "export": {"dir": "/exports"},
                "trainer_id": "me",
            },
            assembler={"app_id": "my-assembler", "datadir": "/asm"},
        )
    )
    layout = RunLayout.create(spec, now=0.0)
    rollout = rollout_section(spec, layout, model_dir=Path("m"), inference_url="i", gateway_url="g")
    assert rollout["manager"] == {"max_staleness": 3, "model_name": "policy",
                                  "trained_statuses": ["COMPLETED"], "min_trained_per_group": 1}
    assert rollout["kafka"]["bootstrap_servers"] == "k:1" == spec.bootstrap_servers  # adopted run-wide
    trainer = trainer_section(spec, layout, model_dir=Path("m"))
    assert trainer["recipe"] == "dr_grpo"
    assert trainer["source"] == {
        "bootstrap_servers": "k:1",
        "topic": layout.topics.batches,
        "group_id": "mine",
        "poll_timeout_s": 0.5,
    }
    assert trainer["checkpoint"] == {"dir": "/ckpt", "resume": True}
    assert trainer["export"]["dir"] == "/exports" and trainer["trainer_id"] == "me"
    assembler = assembler_section(spec, layout)["assembler"]
    assert assembler["app_id"] == "my-assembler" and assembler["datadir"] == "/asm"
    assert spec.trainer["source"] == {"poll_timeout_s": 0.5, "group_id": "mine"}  # spec not mutated


@pytest.mark.parametrize(
    ("assembler", "statuses", "needed"),
    [
        ({}, ("COMPLETED",), 1),
        ({"filtering": {"ok_statuses": ["COMPLETED", "TRUNCATED"]}, "grouping": {"min_group_size": 2}},
         ("COMPLETED", "TRUNCATED"), 2),
        ({"filtering": {"failure_policy": "mask"}}, None, 1),
        ({"grouping": {"partial_policy": "drop"}}, ("COMPLETED",), 4),
    ],
)
def test_the_rollout_counts_under_its_staleness_bound_only_groups_the_assembler_batches(
    assembler: dict[str, Any], statuses: tuple[str, ...] | None, needed: int
) -> None:
    from stacx.rollout.config import RolloutConfig
    from stacx.schemas.config import build

    spec = parse_spec(_tree(assembler=assembler))
    layout = RunLayout.create(spec, now=0.0)
    section = rollout_section(spec, layout, model_dir=Path("m"), inference_url="http://127.0.0.1:1",
                              gateway_url="http://127.0.0.1:2")
    manager = build(RolloutConfig, section, where="rollout").manager
    assert (manager.trained_statuses, manager.min_trained_per_group) == (statuses, needed)


def test_a_topic_or_model_name_set_once_holds_for_every_service() -> None:
    spec = parse_spec(
        _tree(assembler={"batches_topic": "my.batches"}, trainer={"export": {"model_name": "pol"}})
    )
    layout = RunLayout.create(spec, now=0.0)
    assert layout.topics.batches == "my.batches" and layout.model_name == "pol"
    services = plan(spec, layout, model_dir=Path("m"))
    assert services.trainer["source"]["topic"] == "my.batches"
    assert services.rollout["manager"]["model_name"] == "pol"


def test_disagreeing_wires_name_both_places() -> None:
    (line,) = _errors(_tree(rollout={"kafka": {"weights_topic": "a"}}, trainer={"export": {"topic": "b"}}))
    assert "rollout.kafka.weights_topic='a', trainer.export.topic='b'" in line
    assert "must agree on one weights_topic" in line


def test_values_the_pipeline_owns_are_rejected_not_overwritten() -> None:
    lines = _errors(
        _tree(
            rollout={"data": {"path": "other.jsonl"}, "inference": {"url": "http://elsewhere:1"}},
            trainer={"models": {"policy": {"path": "/my/model"}}, "max_steps": 3},
        )
    )
    assert len(lines) == 4
    assert any("rollout.data.path='other.jsonl': the tasks come from pipeline.tasks" in x for x in lines)
    assert any("rollout.inference.url='http://elsewhere:1': the pipeline starts" in x for x in lines)
    assert any(
        "trainer.models.policy.path='/my/model': the model comes from pipeline.model" in x for x in lines
    )
    assert any("trainer.max_steps=3: set pipeline.steps instead" in x for x in lines)
    same = parse_spec(_tree(rollout={"inference": {"url": "http://127.0.0.1:30010"}}))  # equal: fine
    assert same.rollout["inference"]["url"] == "http://127.0.0.1:30010"


def _check_lines(tree: dict[str, Any], base_dir: Path | None = None) -> list[str]:
    spec = parse_spec(tree, source="f.yaml", base_dir=base_dir)
    with pytest.raises(PipelineConfigError) as info:
        check_resolved(spec)
    return str(info.value).splitlines()


def test_recipe_scaffold_reward_and_strategy_are_resolved_up_front() -> None:
    from stacx.trainer import list_recipes

    known = sorted(name for name, _ in list_recipes())
    assert {"grpo", "sft", "dagger"} <= set(known)
    assert _check_lines(_tree(trainer={"recipe": "grpoo"})) == [
        f"f.yaml: trainer.recipe: 'grpoo' is not a known recipe; use one of {known} or a dotted path "
        "package.module:object (`stacx plugins` lists them); did you mean 'grpo'?"
    ]
    evaluator = {"scaffold": "termnal"}
    (line,) = _check_lines(_tree(rollout={"manager": {"evaluators": {"default": evaluator}}}))
    assert line.startswith(
        "f.yaml: rollout.manager.evaluators.default.scaffold: 'termnal' is not a known scaffold; "
        "use one of ['retool', 'single_turn', 'terminal']"
    )
    assert line.endswith("; did you mean 'terminal'?")
    evaluator = {"scaffold": "retool", "reward": "exact"}
    (line,) = _check_lines(_tree(rollout={"manager": {"evaluators": {"default": evaluator}}}))
    assert line.startswith(
        "f.yaml: rollout.manager.evaluators.default.reward: 'exact' is not a known reward function; "
        "use one of"
    )
    (line,) = _check_lines(_tree(rollout={"manager": {"scheduler": {"strategy": "lifo"}}}))
    assert line.startswith(
        "f.yaml: rollout.manager.scheduler.strategy: 'lifo' is not a known scheduling strategy; use one of "
        "['fair_share', 'fifo', 'priority', 'task_aware']"
    )


def test_a_recipe_needing_greedy_rows_is_refused_in_one_line() -> None:
    """ReMax needs a greedy sample per group, which the pipeline's rollout never samples: the
    config is refused before anything starts, not by every batch at the trainer."""
    (line,) = _check_lines(_tree(trainer={"recipe": "remax"}))
    assert line.startswith("f.yaml: trainer.recipe: 'remax' needs one greedy (temperature 0) "
                           "sample per prompt group")


def test_the_group_size_set_in_one_place_holds_in_both() -> None:
    spec = parse_spec(_tree(rollout=None, assembler={"grouping": {"group_size": 6}}))
    services = plan(spec, RunLayout.create(spec, now=0.0), model_dir=Path("m"))
    assert services.rollout["data"]["samples_per_task"] == 6
    spec = parse_spec(_tree(rollout={"data": {"samples_per_task": 3}}))
    services = plan(spec, RunLayout.create(spec, now=0.0), model_dir=Path("m"))
    assert services.assembler["assembler"]["grouping"]["group_size"] == 3
    (line,) = _errors(
        _tree(rollout={"data": {"samples_per_task": 4}}, assembler={"grouping": {"group_size": 8}})
    )
    assert "rollout.data.samples_per_task=4, assembler.grouping.group_size=8" in line
    (line,) = _check_lines(_tree(rollout=None))  # neither set: the defaults (1 and 8) disagree
    assert "assembler.grouping.group_size=8 but rollout.data.samples_per_task=1" in line


def test_model_and_task_paths_are_resolved_up_front(tmp_path: Path) -> None:
    tree = _tree(pipeline={"model": {"path": "no-model"}, "tasks": {"harbor": "no-tasks"}})
    lines = _check_lines(tree, base_dir=tmp_path)
    assert lines == [
        f"f.yaml: pipeline.model.path={tmp_path / 'no-model'}: no such directory "
        "(`stacx models tiny --out DIR` makes a small model)",
        f"f.yaml: pipeline.tasks.harbor={tmp_path / 'no-tasks'}: {tmp_path / 'no-tasks'} is not a directory",
    ]
    (tmp_path / "model").mkdir()
    tasks = tmp_path / "tasks"
    shutil.copytree(REPO / "examples" / "tasks" / "write-file", tasks / "write-file")
    shutil.copytree(REPO / "examples" / "tasks" / "sort-files", tasks / "sort-files")
    (tasks / "sort-files" / "instruction.md").unlink()  # a broken task
    tree = _tree(pipeline={"model": {"path": "model"}, "tasks": {"harbor": "tasks"}})
    lines = _check_lines(tree, base_dir=tmp_path)
    assert len(lines) == 2
    no_config = "no config.json; point it at a Hugging Face model directory"
    assert lines[0] == f"f.yaml: pipeline.model.path={tmp_path / 'model'}: {no_config}"
    assert lines[1].startswith(f"f.yaml: pipeline.tasks.harbor: {tasks / 'sort-files'}:")
    assert "instruction.md" in lines[1]


def test_jsonl_tasks_are_checked_row_by_row(tmp_path: Path) -> None:
    rows = tmp_path / "tasks.jsonl"
    rows.write_text('{"task_id": "a", "task_type": "t", "prompt": "p"}\n{"task_id": "b"}\n')
    tree = _tree(pipeline={"model": {"tiny": {}}, "tasks": {"jsonl": str(rows)}})
    (line,) = _check_lines(tree)
    assert line.startswith(f"f.yaml: pipeline.tasks.jsonl: {rows}:2:") and "prompt" in line


def test_explain_prints_every_service_with_defaults(tmp_path: Path) -> None:
    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    text = explain(spec, RunLayout.create(spec, now=0.0))
    doc = yaml.safe_load(text)
    services = doc["services"]
    assert set(services) == {"gateway", "inference", "rollout", "assembler", "trainer"}
    gateway, server = services["gateway"], services["inference"]["server"]
    assert (gateway["host"], gateway["port"], gateway["backend"]) == ("127.0.0.1", 8710, "docker")
    assert gateway["sessions"]["warm_pool_size"] == 8 and gateway["sessions"]["reuse_pool_size"] == 64
    assert gateway["sessions"]["owner"] == "stacx-quickstart-19700101-000000"
    assert (server["port"], server["torch_threads"], server["engine"]["max_batch_size"]) == (30010, 1, 64)
    assert services["inference"]["weights_topic"] == doc["run"]["topics"]["weights"]
    assert services["trainer"]["recipe"] == "grpo" and services["trainer"]["optimizer"]["lr"] == 0.0007
    assert services["trainer"]["optimizer"]["weight_decay"] == 0.0  # a default, shown
    assert services["rollout"]["manager"]["evaluators"]["arithmetic_tool"]["top_p"] == 1.0
    assert services["assembler"]["dlq_topic"] == "stacx.dlq"
    assert doc["run"]["topics"]["batches"] == "stacx.batches.quickstart-19700101-000000"


def test_a_restarted_trainer_resumes_from_its_checkpoint_by_default() -> None:
    """Break 1: the run's trainer config used to say `checkpoint.resume: false`, so a restarted
    trainer began at step 1 from the initial weights while reading from the committed offsets."""
    from stacx.infra.config import build
    from stacx.trainer.config import TrainerConfig

    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    layout = RunLayout.create(spec, now=0.0)
    section = trainer_section(spec, layout, model_dir=Path("m"))
    section["models"]["policy"] = {"tiny": {}}
    config = build(TrainerConfig, section, where="trainer")
    assert config.checkpoint.resume is True
    assert config.checkpoint.dir == str(layout.checkpoints_dir.resolve())
    opted_out = parse_spec(_tree(trainer={"checkpoint": {"resume": False}}))
    assert trainer_section(opted_out, layout, model_dir=Path("m"))["checkpoint"]["resume"] is False


def test_the_rollout_service_reads_the_run_tasks_through_a_consumer_group() -> None:
    """A restarted rollout service must go on from its committed tasks, not from the first one."""
    from stacx.infra.pipeline.tasks import task_order
    from stacx.rollout.config import RolloutConfig
    from stacx.schemas.config import build

    spec = load_spec(REPO / "examples" / "quickstart.yaml")
    layout = RunLayout.create(spec, now=0.0)
    section = rollout_section(
        spec, layout, model_dir=Path("m"), inference_url="http://127.0.0.1:1", gateway_url="http://127.0.0.1:2"
    )
    data = build(RolloutConfig, section, where="test").data
    assert data.topic == layout.topics.tasks == f"stacx.tasks.{layout.run_id}" and data.path is None
    assert data.consumer_group == f"stacx-rollout-{layout.run_id}"
    assert layout.topics.tasks in {t.name for t in layout.topics.specs()}
    rows = [{"task_id": str(i)} for i in range(5)]
    order = task_order(rows, passes=2, seed=3)
    assert len(order) == 10 and sorted(r["task_id"] for r in order[:5]) == ["0", "1", "2", "3", "4"]
    assert order == task_order(rows, passes=2, seed=3)


def test_gateway_and_inference_are_sections_that_the_standalone_commands_read(tmp_path: Path) -> None:
    from stacx.infra.cli import build_parser
    from stacx.infra.commands.sandbox import gateway_config
    from stacx.infra.commands.serve import serve_config

    spec = parse_spec(_tree(gateway={"port": 8799, "sessions": {"warm_pool_size": 3}},
                            inference={"server": {"port": 30099, "torch_threads": 2}}))
    layout = RunLayout.create(spec, now=0.0)
    services = plan(spec, layout, model_dir=Path("m"))
    assert services.rollout["sandbox"]["url"] == "http://127.0.0.1:8799"
    assert services.rollout["inference"]["url"] == "http://127.0.0.1:30099"
    path = tmp_path / "services.yaml"  # what the run writes, read back as `stacx gateway/serve --config`
    path.write_text(yaml.safe_dump({"gateway": services.gateway, "inference": services.inference}))
    gateway = gateway_config(build_parser().parse_args(["gateway", "--config", str(path)]))
    assert (gateway.port, gateway.sessions.warm_pool_size) == (8799, 3)
    assert gateway.sessions.owner == f"stacx-{layout.run_id}"
    serve = serve_config(build_parser().parse_args(["serve", "--config", str(path)]))
    assert (serve.server.port, serve.server.torch_threads, serve.server.model_path) == (30099, 2, "m")
    assert serve.follow_weights == layout.model_name and serve.weights_topic == layout.topics.weights


def test_a_former_services_field_is_one_line_naming_its_section() -> None:
    lines = _errors(_tree(pipeline={"services": {"gateway_port": 8711, "inference_threads": 2}}))
    assert lines == [
        "f.yaml: pipeline.services.gateway_port: moved; set gateway.port (its own section)",
        "f.yaml: pipeline.services.inference_threads: moved; set inference.server.torch_threads "
        "(its own section)",
    ]


def test_gateway_and_inference_sections_are_checked_with_their_field_paths() -> None:
    lines = _errors(_tree(gateway={"port": "high", "sesions": {}}, inference={"server": {"threads": 2}}))
    assert sorted(line.split(": ")[1] for line in lines) == [
        "gateway.port",
        "gateway.sesions",
        "inference.server.threads",
    ]
