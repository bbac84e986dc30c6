"""The pipeline gives the assembler the model's vocabulary size (`filtering.vocab_size`), read from
the model directory the services start from; a value the user set is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stacx.consumers.assembly import AssemblerApp
from stacx.infra.config import build
from stacx.infra.pipeline.config import parse_spec
from stacx.infra.pipeline.layout import RunLayout
from stacx.infra.pipeline.resolve import plan
from stacx.rollout.models.tiny import make_tiny_model

REPO = Path(__file__).resolve().parents[3]


def _spec(assembler: dict[str, Any] | None = None) -> Any:
    tree: dict[str, Any] = {
        "pipeline": {
            "model": {"tiny": {}},
            "tasks": {"source": "quickstart.arithmetic:ArithmeticTasks"},
            "plugin_paths": [str(REPO / "examples")],
        },
        "rollout": {"data": {"samples_per_task": 4}},
    }
    if assembler is not None:
        tree["assembler"] = assembler
    return parse_spec(tree, source="f.yaml")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("model"))


def _vocab_size(model_dir: Path) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(str(model_dir)).vocab_size)


def test_the_assembler_gets_the_models_vocabulary_size(model_dir: Path) -> None:
    spec = _spec()
    services = plan(spec, RunLayout.create(spec, now=0.0), model_dir=model_dir)
    section = services.assembler["assembler"]
    assert section["filtering"]["vocab_size"] == _vocab_size(model_dir)
    built = build(AssemblerApp.Config, section, where="assembler")
    assert built.filtering.vocab_size == _vocab_size(model_dir)


def test_a_vocab_size_the_user_set_is_kept(model_dir: Path) -> None:
    spec = _spec({"filtering": {"vocab_size": 7, "max_staleness": 2}})
    section = plan(spec, RunLayout.create(spec, now=0.0), model_dir=model_dir).assembler["assembler"]
    assert section["filtering"] == {"vocab_size": 7, "max_staleness": 2}


def test_a_model_not_made_yet_leaves_it_unset(tmp_path: Path) -> None:
    spec = _spec()
    section = plan(spec, RunLayout.create(spec, now=0.0), model_dir=tmp_path / "later").assembler["assembler"]
    assert "vocab_size" not in section.get("filtering", {})
