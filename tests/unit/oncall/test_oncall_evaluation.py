"""The gate's held-out evaluation against a real (in-process) built-in server."""

from __future__ import annotations

import json
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


def test_scorer_specs_are_checked() -> None:
    with pytest.raises(ConfigError, match="module:function"):
        load_scorer("no_colon")
    assert load_scorer("json:dumps") is json.dumps
