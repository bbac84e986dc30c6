"""Every example trainer config loads and names a registered recipe (all errors at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.infra.cli import main
from stacx.trainer import ConfigError, TrainerConfig, get_recipe, load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "train"


def test_every_example_config_loads() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files, f"no example configs in {EXAMPLES}"
    errors = []
    for path in files:
        try:
            config = load_config(path)
            assert isinstance(config, TrainerConfig)
            get_recipe(config.recipe)
        except Exception as exc:  # collect every failure, report them together
            errors.append(f"{path.name}: {exc}")
    assert not errors, "\n".join(errors)


def test_unknown_field_names_the_valid_ones(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("recipe: sft\nmodels: {policy: {tiny: {}}}\noptimiser: {lr: 1}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: optimiser: unknown field; valid fields: .*optimizer"):
        load_config(path)


def test_nested_errors_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  recipe: sft\n  models: {policy: {tiny: {}, sede: 1}}\n")
    with pytest.raises(ConfigError, match=r"trainer\.models\.policy\.sede: unknown field"):
        load_config(path)


def test_every_wrong_type_is_refused_with_its_field_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("recipe: sft\nmodels: {policy: {tiny: {}}}\noptimizer: {lr: fast}\n"
                    "backend: {world_size: 0}\nseed: one\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert sorted(info.value.lines) == [
        f"{path}: backend.world_size: expected greater than 0, got 0",
        f"{path}: optimizer.lr: expected a valid number, got 'fast'",
        f"{path}: seed: expected a valid integer, got 'one'",
    ]


def test_model_needs_exactly_one_source() -> None:
    from stacx.trainer import ModelConfig

    with pytest.raises(ConfigError, match="exactly one of `path`"):
        ModelConfig()


def test_stacx_recipes_lists_every_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["recipes"])
    assert exit_info.value.code == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"sft", "grpo", "ppo", "dpo", "opd", "gspo", "dr_grpo"} <= set(listed)


def test_stacx_train_reports_an_unknown_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("recipe: nope\nmodels: {policy: {tiny: {}}}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", str(path)])
    assert exit_info.value.code == 2  # a config error: one line, nothing started
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"stacx train: {path}: recipe: 'nope' is not a known recipe; use one of")
