"""`stacx schemas check|register|list` against a fresh catalogue topic."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from stacx.infra.cli import main
from stacx.schemas.codec import builtin_schemas


def stacx(*argv: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    return int(exit_info.value.code or 0)


def test_check_rejects_an_incompatible_change_and_accepts_a_compatible_one(
    kafka_bootstrap: str, fresh_topic: Callable[..., str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalogue = fresh_topic("schemas", config={"cleanup.policy": "compact"})
    common = ("--bootstrap", kafka_bootstrap, "--topic", catalogue)
    assert stacx("schemas", "register", *common) == 0
    feedback = next(i for i in builtin_schemas() if i.name == "stacx.Feedback").schema
    retyped = copy.deepcopy(feedback)
    next(f for f in retyped["fields"] if f["name"] == "reward")["type"] = "string"
    added = copy.deepcopy(feedback)
    added["fields"].append({"name": "channel", "type": "string", "default": "web"})
    (tmp_path / "bad.avsc").write_text(json.dumps(retyped))
    (tmp_path / "good.avsc").write_text(json.dumps(added))
    capsys.readouterr()
    assert stacx("schemas", "check", *common, "--schema", str(tmp_path / "bad.avsc")) == 1
    assert "reward: writer double cannot be read as string" in capsys.readouterr().err
    assert stacx("schemas", "check", *common, "--schema", str(tmp_path / "good.avsc")) == 0
    capsys.readouterr()
    assert stacx("schemas", "list", *common) == 0
    listed = capsys.readouterr().out
    assert listed.count("local (current), registered") == len(builtin_schemas())
