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
