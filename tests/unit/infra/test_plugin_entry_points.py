"""Entry points as `stacx plugins` shows them: a broken one is flagged (exit status 1), one that
a built-in name shadows is said, a config naming a shadowed name gets a warning, and a mistyped
name is pointed at its close match."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.infra.cli import main
from stacx.rollout.errors import ConfigError
from stacx.rollout.rewards import get_reward

ENTRY_POINTS = """\
[stacx.rewards]
broken = nopkg_xyz.rewards:score
exact_answer = epdist_rewards:score
healthy = epdist_rewards:score
"""


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Path]:
    """A distribution `epdist` with entry points in `stacx.rewards`, found on sys.path the way
    `pip install` would leave it (a dist-info folder beside its module)."""
    info = tmp_path / "epdist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epdist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (tmp_path / "epdist_rewards.py").write_text("def score(answer, data):\n    return {'reward': 1.0}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("epdist_rewards", None)


def test_broken_and_shadowed_entry_points_are_flagged(installed: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plugins", "rewards"])
    out, err = capsys.readouterr()
    assert info.value.code == 1
    assert "healthy" in out and "entry point stacx.rewards of epdist (epdist_rewards:score)" in out
    assert err.splitlines() == [
        "stacx plugins: rewards: broken: broken: 'nopkg_xyz.rewards:score': module 'nopkg_xyz' not found "
        "(put its folder on PYTHONPATH or install it)",
        "stacx plugins: rewards: exact_answer: shadowed by the builtin (stacx.rollout.rewards) of that "
        "name, which configs get; rename the entry point",
    ]


def test_a_shadowed_name_resolves_to_ours_with_a_warning(installed: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="stacx.schemas.plugins"):
        score = get_reward("exact_answer")
    assert score("4", {"answer": "4"})["reward"] == 1.0
    assert any("the entry point stacx.rewards (epdist_rewards:score) is ignored" in r.message
               for r in caplog.records)


def test_a_healthy_entry_point_resolves_and_a_typo_points_at_it(installed: Path) -> None:
    assert get_reward("healthy")("x", {})["reward"] == 1.0
    typo = r"'healthyy' is not a known reward function; .*did you mean 'healthy'\?$"
    with pytest.raises(ConfigError, match=typo):
        get_reward("healthyy")
