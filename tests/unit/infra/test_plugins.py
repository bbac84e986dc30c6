"""Plug-ins by name: a dotted path, a registered name or an entry point resolves at every point,
and each way a plug-in can be broken is one line naming its cause."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.infra.cli import main
from stacx.rollout.errors import ConfigError
from stacx.rollout.rewards import get_reward
from stacx.rollout.scaffolds import build_scaffold
from stacx.rollout.scheduler import TaskScheduler, build_strategy
from stacx.trainer import get_recipe

PACKAGE = {
    "__init__.py": "",
    "rewards.py": (
        "def score(answer, data, *, bonus=0.0):\n"
        "    return {'reward': float(answer == data.get('answer')) + bonus, 'plugin': 1.0}\n"
        "def two(answer):\n    return {'reward': 0.0}\n"
    ),
    "broken.py": "raise RuntimeError('no licence key\\nsecond line')\n",
    "needs.py": "import no_such_dependency\n",
    "scaffolds.py": (
        "from stacx.rollout.scaffolds import SingleTurnScaffold\n"
        "def Echo(**options):\n    return SingleTurnScaffold(name='echo', **options)\n"
    ),
    "raising.py": "def Boom(**options):\n    raise ValueError('bad option\\nmore')\n",
    "recipes.py": (
        "from stacx.trainer.recipes.grpo import grpo\ndef mine():\n    '''Mine.'''\n    return grpo()\n"
    ),
}


@pytest.fixture
def plugin_package(tmp_path: Path) -> Iterator[str]:
    """A package `pluginpkg_<id>` in a temp dir on sys.path (as PYTHONPATH puts it there)."""
    name = f"pluginpkg_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / name
    root.mkdir()
    for file, text in PACKAGE.items():
        (root / file).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]


def test_a_reward_by_dotted_path_with_options(plugin_package: str) -> None:
    fn = get_reward(f"{plugin_package}.rewards:score", {"bonus": 0.5})
    assert fn("4", {"answer": "4"}) == {"reward": 1.5, "plugin": 1.0}


def test_each_kind_of_broken_plugin_is_one_line(plugin_package: str) -> None:
    cases = {
        "nopkg_xyz.rewards:score": "'nopkg_xyz.rewards:score': module 'nopkg_xyz' not found (put its folder "
        "on PYTHONPATH or install it)",
        f"{plugin_package}.rewards:scor": f"'{plugin_package}.rewards:scor': '{plugin_package}.rewards' has "
        "no attribute 'scor'",
        f"{plugin_package}.broken:score": f"'{plugin_package}.broken:score': importing "
        f"'{plugin_package}.broken' raised RuntimeError: no licence key",
        f"{plugin_package}.needs:score": f"'{plugin_package}.needs:score': importing "
        f"'{plugin_package}.needs' raised ModuleNotFoundError: No module named 'no_such_dependency'",
    }
    for ref, message in cases.items():
        with pytest.raises(ConfigError) as info:
            get_reward(ref)
        assert str(info.value) == message
    with pytest.raises(ConfigError) as info:
        get_reward(f"{plugin_package}.rewards:two")
    assert str(info.value).startswith(
        f"'{plugin_package}.rewards:two': wrong signature for a reward function: "
        "cannot be called as f(str, dict)"
    )


def test_a_plugin_that_raises_when_built_is_one_line_naming_the_exception(plugin_package: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_scaffold(f"{plugin_package}.raising:Boom", system_prompt="")
    assert str(info.value) == (
        f"'{plugin_package}.raising:Boom': building the scaffold raised ValueError: bad option"
    )


def test_scaffold_recipe_and_strategy_by_dotted_path(plugin_package: str) -> None:
    scaffold = build_scaffold(f"{plugin_package}.scaffolds:Echo", system_prompt="")
    assert scaffold.name == "echo" and not scaffold.needs_sandbox
    assert get_recipe(f"{plugin_package}.recipes:mine").description
    assert build_strategy(TaskScheduler.Config(strategy="priority")).name == "priority"
    with pytest.raises(ConfigError, match="wrong signature for a scheduling strategy"):
        # FifoStrategy takes no config
        build_strategy(TaskScheduler.Config(strategy="stacx.rollout.scheduler:FifoStrategy"))


def test_stacx_plugins_lists_every_point(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plugins"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for point in ("rewards", "scaffolds", "blackbox_scaffolds", "task_sources", "verifiers", "recipes",
                  "strategies", "inference_engines"):
        assert f"{point}  (entry-point group stacx.{point}" in out
    assert "exact_answer       builtin (stacx.rollout.rewards)" in out
