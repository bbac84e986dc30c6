"""`stacx replay` arguments override the config file's replay and trainer fields."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from stacx.infra.commands.replay import epoch_ms, load
from stacx.infra.config import ConfigError


def _args(config: Path, **over: object) -> argparse.Namespace:
    fields = dict.fromkeys(
        ("name", "source", "from_offset", "to_offset", "from_time", "to_time", "recipe", "seed")
    )
    return argparse.Namespace(config=str(config), **{**fields, **over})


def test_overrides_win_and_times_are_parsed(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        yaml.safe_dump({"replay": {"name": "a", "source_topic": "t"}, "trainer": {"recipe": "grpo"}})
    )
    spec = load(
        _args(
            path,
            name="b",
            from_time="2026-11-30T00:00:00+00:00",
            to_time="1796000000000",
            recipe="sft",
            seed=7,
        )
    )
    assert (spec.replay.name, spec.replay.source_topic) == ("b", "t")
    assert spec.replay.from_timestamp_ms == epoch_ms("2026-11-30T00:00:00+00:00") == 1_795_996_800_000
    assert spec.replay.to_timestamp_ms == 1796000000000
    assert spec.trainer == {"recipe": "sft", "seed": 7}


def test_a_missing_source_topic_is_named(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"replay": {"name": "a"}}))
    with pytest.raises(ConfigError, match="source_topic"):
        load(_args(path))


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "replay" / "grpo_tiny.yaml"


def _apply_role_options(trainer: dict[str, object]) -> None:
    """What the trainer does with `role_options` when it builds the recipe's roles."""
    import dataclasses

    from stacx.trainer.recipe import get_recipe

    recipe = get_recipe(str(trainer["recipe"]))
    options = trainer.get("role_options") or {}
    assert isinstance(options, dict)
    for role in recipe.roles:  # as `RoleWorker.with_options` applies them
        spec: object = role.specialization
        dataclasses.replace(spec, **options.get(role.name, {}))  # type: ignore[type-var]


def test_the_documented_recipe_override_leaves_out_the_options_the_new_recipe_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = load(_args(EXAMPLE, recipe="sft", source="stacx.trajectories.run-1", name="replay-sft-1"))
    _apply_role_options(spec.trainer)  # the trainer accepts them (kl_beta made sft a TypeError)
    assert spec.trainer["recipe"] == "sft" and spec.trainer["role_options"] == {}
    from stacx.infra.replay import check_role_options

    check_role_options(spec.trainer)
    err = capsys.readouterr().err
    assert "trainer.role_options.policy.kl_beta is not an option of sft, left out" in err
    same = load(_args(EXAMPLE))  # the file's own recipe keeps its options
    assert same.trainer["role_options"] == {"policy": {"kl_beta": 0.0}}
    _apply_role_options(same.trainer)


def test_an_option_the_recipe_lacks_is_one_line_before_anything_runs() -> None:
    from stacx.infra.replay import check_role_options

    with pytest.raises(ValueError, match=r"^trainer.role_options.policy.kl_beta: recipe 'sft' has no such"):
        check_role_options({"recipe": "sft", "role_options": {"policy": {"kl_beta": 0.1}}})
    with pytest.raises(ValueError, match=r"^trainer.role_options.critic: recipe 'grpo' has no role"):
        check_role_options({"recipe": "grpo", "role_options": {"critic": {}}})


def test_the_example_model_holds_the_pipeline_vocabulary() -> None:
    from stacx.infra.config import build
    from stacx.rollout.models.tokenizer import make_tokenizer
    from stacx.trainer import TrainerConfig
    from stacx.trainer.models import tiny_qwen2_config

    config = build(TrainerConfig, load(_args(EXAMPLE)).trainer, where="grpo_tiny.yaml: trainer")
    tiny = config.models["policy"].tiny
    assert tiny is not None
    assert tiny_qwen2_config(**tiny).vocab_size >= len(make_tokenizer())  # the quickstart's tokenizer


def test_a_model_smaller_than_the_replayed_vocabulary_is_one_line() -> None:
    from stacx.infra.replay import check_vocabulary
    from stacx.rollout.models.tokenizer import make_tokenizer

    pipeline_max_id = len(make_tokenizer()) - 1  # the quickstart's byte-level tokenizer
    trainer = load(_args(EXAMPLE)).trainer
    check_vocabulary(trainer, pipeline_max_id, "stacx.trajectories.run-1")
    small = {**trainer, "models": {"policy": {"tiny": {}, "seed": 0}}}  # 64 tokens
    with pytest.raises(ValueError, match=r"^trainer.models.policy: its vocabulary has 64 tokens but "
                                         r"stacx.trajectories.run-1 holds token id 262"):  # fmt: skip
        check_vocabulary(small, pipeline_max_id, "stacx.trajectories.run-1")
    check_vocabulary(small, 63, "t")
