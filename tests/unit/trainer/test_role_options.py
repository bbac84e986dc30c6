"""`trainer.role_options` against the options the recipe declares (the fields of each role's
specialization): every problem one line with its path, checked before the trainer starts."""

from __future__ import annotations

from stacx.trainer.recipe import get_recipe, role_options_problems


def test_every_role_options_problem_is_one_line_with_its_path() -> None:
    grpo = get_recipe("grpo")
    options = {
        "policy": {"kl_bta": 0.1, "clip_low": "wide", "kl_beta": 0.0},
        "critik": {},
        "reference": 3,
    }
    lines = role_options_problems(grpo, "grpo", options)
    assert len(lines) == 4, lines
    assert lines[0].startswith("role_options.policy.kl_bta: recipe 'grpo' declares no such option for role "
                               "policy (its options: ")
    assert lines[0].endswith("; did you mean 'kl_beta'?")
    assert lines[1] == "role_options.policy.clip_low: expected a valid number, got 'wide'"
    assert lines[2] == ("role_options.critik: recipe 'grpo' has no role 'critik' "
                        "(its roles: policy, reference)")
    assert lines[3] == "role_options.reference: expected a mapping of options, got 3"


def test_a_value_outside_the_options_type_names_the_option() -> None:
    (line,) = role_options_problems(get_recipe("grpo"), "grpo", {"policy": {"kl_estimator": "k9"}})
    assert line == "role_options.policy.kl_estimator: expected 'k1', 'k2' or 'k3', got 'k9'"


def test_a_value_the_roles_own_check_refuses_names_the_role() -> None:
    (line,) = role_options_problems(get_recipe("grpo"), "grpo", {"policy": {"dual_clip": 0.5}})
    assert line.startswith("role_options.policy: ") and "dual_clip=0.5 must be > 1" in line


def test_options_the_recipe_declares_apply() -> None:
    options = {"policy": {"kl_beta": 0.0, "clip_high": 0.28}}
    assert role_options_problems(get_recipe("grpo"), "grpo", options) == []


def test_stacx_train_refuses_bad_role_options_before_training(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from stacx.infra.cli import main

    path = tmp_path / "trainer.yaml"
    path.write_text("recipe: grpo\nmodels: {policy: {tiny: {}}}\nsource: {kind: memory}\n"
                    "role_options: {policy: {kl_bta: 0.1}}\n")
    with pytest.raises(SystemExit) as info:
        main(["train", str(path)])
    (line,) = capsys.readouterr().err.splitlines()
    assert info.value.code == 2
    assert line.startswith(f"stacx train: {path}: role_options.policy.kl_bta: recipe 'grpo' declares no such")


def test_stacx_train_field_flags_are_validated_like_the_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`--world-size 0` was silently ignored: a generated flag is validated with its field path."""
    import pytest

    from stacx.infra.cli import main

    path = tmp_path / "trainer.yaml"
    path.write_text("recipe: grpo\nmodels: {policy: {tiny: {}}}\nsource: {kind: memory}\n")
    with pytest.raises(SystemExit) as info:
        main(["train", str(path), "--backend.world_size", "0", "--optimizer.lr", "fast", "--explain"])
    assert info.value.code == 2
    assert sorted(capsys.readouterr().err.splitlines()) == [
        f"stacx train: {path}: backend.world_size: expected greater than 0, got 0",
        f"stacx train: {path}: optimizer.lr: expected a valid number, got 'fast'",
    ]
