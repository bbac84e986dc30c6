"""The gate's held-out evaluation against a real (in-process) built-in server."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pytest

from stacx.rollout.inference import InferenceServer
from stacx.trainer.errors import ConfigError
from stacx.trainer.oncall import HeldOutEvaluator, load_scorer


def test_evaluator_loads_the_candidate_scores_tasks_and_counts_malformed_calls(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(4))
    )
    (tmp_path / "scorer.py").write_text(
        "from dataclasses import dataclass\n\n@dataclass\nclass Seen:\n    n: int = 0\n\n"  # sys.modules
        "def score(task, message):\n"
        "    return 1.0 if task['messages'][0]['content'] in ('q0', 'q1') else 0.0\n"
    )
    with InferenceServer(InferenceServer.Config(model_path=str(tiny_model_dir), port=0)) as server:
        evaluator = HeldOutEvaluator(
            HeldOutEvaluator.Config(
                staging_url=server.base_url,
                tasks_path=str(tasks),
                scorer=f"{tmp_path / 'scorer.py'}:score",
                max_tokens=4,
            )
        )
        report = evaluator.evaluate(str(tiny_model_dir), 7)
        assert server.engine.weight_version == "eval-7"  # the candidate was loaded first
    assert report.success_rate == 0.5 and report.num_tasks == 4 and report.probe_rate == 0.0


def test_scorer_specs_are_checked_through_the_plugin_seam(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^evaluation.scorer: 'no_colon' is not a known scorer"):
        load_scorer("no_colon")
    with pytest.raises(ConfigError, match=r"^evaluation.scorer: 'nopkg_xyz:score': module 'nopkg_xyz'"):
        load_scorer("nopkg_xyz:score")
    with pytest.raises(ConfigError, match=r"'json:dumps': wrong signature for a scorer"):
        load_scorer("json:dumps")  # score(task, message): dumps takes one positional argument
    assert load_scorer("operator:eq") is operator.eq
    with pytest.raises(ConfigError, match=r"file '.*missing.py' not found"):
        load_scorer(f"{tmp_path / 'missing.py'}:score")


def _oncall_file(tmp_path: Path, scorer: str) -> Path:
    import yaml

    tree = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples/oncall/oncall.yaml").read_text())
    tree["evaluation"]["scorer"] = scorer
    path = tmp_path / "oncall.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_stacx_oncall_explain_resolves_the_scorer_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stacx.infra.cli import main

    (tmp_path / "myscorer.py").write_text("def score(task, message):\n    return 1.0\n")
    for scorer, status in ((f"{tmp_path / 'myscorer.py'}:score", 0), ("nopkg_xyz.scorers:score", 2),
                           (f"{tmp_path / 'myscorer.py'}:scor", 2)):
        with pytest.raises(SystemExit) as info:
            main(["oncall", str(_oncall_file(tmp_path, scorer)), "--explain"])
        assert info.value.code == status, capsys.readouterr()
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "stacx oncall: evaluation.scorer: 'nopkg_xyz.scorers:score': module 'nopkg_xyz' not found "
        "(put its folder on PYTHONPATH or install it)",
        f"stacx oncall: evaluation.scorer: '{tmp_path / 'myscorer.py'}:scor': "
        f"'{tmp_path / 'myscorer.py'}' has no attribute 'scor'",
    ]
