"""`stacx replay` arguments override the config file's replay and trainer fields."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from infra.commands.replay import epoch_ms, load
from infra.config import ConfigError


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
