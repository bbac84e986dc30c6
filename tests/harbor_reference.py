"""Harbor's own reading of reward files and its `Mean` metric on shared cases, run in Harbor's
venv (Harbor needs Python >= 3.12; ours is 3.11).

    python harbor_reference.py < cases.json > verdicts.json

Input: {"reward_json": [text, ...], "trials": [[reward dict or null, ...], ...]}; output:
{"reward_json": [rewards as Harbor's VerifierResult holds them, or null when Harbor rejects the
file], "mean": [Mean().compute(trials) for each list]}.
"""

from __future__ import annotations

import json
import math
import sys

from harbor.metrics.mean import Mean
from harbor.models.verifier.result import VerifierResult
from pydantic import ValidationError


def read_reward_json(text: str) -> dict[str, float] | None:
    """What Harbor's verifier accepts from reward.json (its checks: a JSON value whose values are
    finite ints or floats), as its result model then holds it."""
    try:
        rewards = json.loads(text)
    except (ValueError, TypeError):
        return None
    values = rewards.values() if isinstance(rewards, dict) else [rewards]
    if any(not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
           for v in values):
        return None
    try:
        return dict(VerifierResult(rewards=rewards).rewards or {})
    except ValidationError:
        return None


def main() -> None:
    cases = json.load(sys.stdin)
    json.dump({"reward_json": [read_reward_json(text) for text in cases["reward_json"]],
               "mean": [Mean().compute(trials) for trials in cases["trials"]]}, sys.stdout)


if __name__ == "__main__":
    main()
