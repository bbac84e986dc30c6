"""One rule for every command that reads a service section: a pipeline (or stack) file gives its
`<service>:` section, any other file is the section itself; `--explain` validates and prints it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stacx.infra.cli import main
from stacx.rollout.config import RolloutConfig
from stacx.schemas.config import file_section
from stacx.trainer.config import TrainerConfig

REPO = Path(__file__).resolve().parents[3]
PIPELINE = REPO / "examples" / "quickstart.yaml"


def test_a_section_of_a_pipeline_file_or_the_whole_file() -> None:
    tree = {"pipeline": {}, "rollout": {"data": {"path": "t.jsonl"}}, "trainer": {"recipe": "sft"}}
    assert file_section(tree, "rollout", RolloutConfig, "f.yaml") == (tree["rollout"], "f.yaml: rollout")
    assert file_section(tree, "trainer", TrainerConfig, "f.yaml") == (tree["trainer"], "f.yaml: trainer")
    own = {"inference": {"url": "http://x"}, "data": {"path": "t.jsonl"}}  # `inference` is a field here
    assert file_section(own, "inference", RolloutConfig, "r.yaml") == (own, "r.yaml")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.mark.parametrize(("command", "field"), [("train", "trainer.models"), ("rollout", "rollout.data")])
def test_train_and_rollout_read_their_section_of_a_pipeline_file(
    command: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pipeline's sections leave what the run fills (models, tasks) empty: the command reads
    the section and says what is missing for it to run alone, with its path in the file."""
    status, out, err = _run([command, str(PIPELINE), "--explain"], capsys)
    assert status == 2 and out == ""
    assert err.startswith(f"stacx {command}: {PIPELINE}: {field}: "), err


def test_train_explain_prints_the_resolved_config_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"recipe": "grpo", "models": {"policy": {"tiny": {}}},
                                                "source": {"kind": "memory"}}}))
    status, out, err = _run(["train", str(path), "--explain"], capsys)
    assert status == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["recipe"] == "grpo" and resolved["optimizer"]["lr"] == 1e-5  # defaults written out


def test_infra_reads_bootstrap_and_topics_of_a_pipeline_file(tmp_path: Path) -> None:
    """docs/infra.md: `stacx infra up|status|smoke --config FILE` with the run's own file."""
    import argparse

    from stacx.infra.commands.infra import _stack_config

    tree = yaml.safe_load(PIPELINE.read_text())
    tree["topics"] = {"retention_ms": 3_600_000}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    config = _stack_config(argparse.Namespace(config=path))
    assert config.bootstrap_servers == "127.0.0.1:9092" and config.topics.retention_ms == 3_600_000
